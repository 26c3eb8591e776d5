"""A column Spanner changed between STRING and BYTES (``ALTER COLUMN``): the replica's column
follows, its rows converted (bytes are a text's UTF-8), in DuckDB and PostgreSQL, with and
without the streams' history; a batch holding both types stages bytes, also from stage tables
the tasks loaded before the change. No Spark: events are decoded from the bytes the producer
would write, staged as the tasks stage them, and merged by ``ReplicaMerge``."""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from spanner_cdc.consumer.errors import ReplicaQueryError
from spanner_cdc.consumer.sinks.replica.backends import DuckDbBackend, PostgresBackend, SqlBackend
from spanner_cdc.consumer.sinks.replica.history import RowHistory
from spanner_cdc.consumer.sinks.replica.merge import ReplicaMerge
from spanner_cdc.consumer.sinks.replica.names import quote
from spanner_cdc.consumer.sinks.replica.stage.loaded import StagedTables
from spanner_cdc.consumer.sinks.replica.stage.rows import StagedPart, combined, staged_parts
from spanner_cdc.consumer.sinks.replica.stopped import stopped_tables
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import fresh_postgres_database
from testkit.decoding import decoded_events
from testkit.synthetic import ChangeFactory
from tests.unit.consumer.sinks.replica.test_replica_staging import TOPIC, new_decoder

pytestmark = pytest.mark.integration

Value = str | bytes | float | None
#: One change: (type of Note and Tags, mod type, key, Note, Tags).
Change = tuple[str, str, str, Value, list[Value] | None]
HOUR_MICROS = 3_600 * 1_000_000


@pytest.fixture(params=["duckdb", "postgres"])
def backend(request: pytest.FixtureRequest, stack: EmbeddedStack, tmp_path: Path) -> Any:
    opened: SqlBackend = (
        DuckDbBackend(tmp_path / "replica.duckdb")
        if request.param == "duckdb"
        else PostgresBackend(fresh_postgres_database(stack.endpoint("postgres")))
    )
    yield opened
    opened.close()


def record(
    code: str, mod: str, key: str, note: Value, tags: list[Value] | None, *, commit_micros: int | None = None
) -> dict[str, Any]:
    """A change of table Accounts (Id, Note, Tags ARRAY) with Note and Tags of type ``code``;
    values as Spanner's JSON has them (BYTES in base64)."""
    factory = ChangeFactory(columns=[("Id", "STRING", True), ("Note", code, False), ("Tags", code, False)])

    def spelled(value: Value) -> Value:
        return base64.b64encode(value).decode() if isinstance(value, bytes) else value

    values = {"Note": spelled(note), "Tags": None if tags is None else [spelled(t) for t in tags]}
    written = (
        factory.record("DELETE", {"Id": key}, {}, values, commit_micros)
        if mod == "DELETE"
        else factory.record(mod, {"Id": key}, values, commit_micros=commit_micros)
    )
    written["column_types"][2]["type"] = {"code": "ARRAY", "array_element_type": {"code": code}}
    return written


def parts(records: Sequence[dict[str, Any]], first_offset: int) -> list[StagedPart]:
    """The stage rows of ``records``, each table's decoded from its own topic."""
    events = []
    for table in sorted({r["table_name"] for r in records}):
        own = [r for r in records if r["table_name"] == table]
        events += decoded_events(
            new_decoder(), own, TOPIC.replace("Accounts", table), first_offset=first_offset
        )
    return staged_parts(events)


def merged_batches(backend: SqlBackend, batches: Sequence[Sequence[Change]], history: bool) -> ReplicaMerge:
    """``batches`` merged in turn as batches 0, 1, ... (a batch the replica has is skipped)."""
    return merged_records(backend, [[record(*change) for change in batch] for batch in batches], history)


def merged_records(
    backend: SqlBackend, batches: Sequence[Sequence[dict[str, Any]]], history: bool
) -> ReplicaMerge:
    merge = ReplicaMerge(backend, RowHistory(backend, HOUR_MICROS) if history else None)
    offset = 0
    for batch_id, records in enumerate(batches):
        with merge.batch("retype", batch_id) as new:
            if new:
                merge.write(combined(parts(records, offset)), cut=batch_id + 1 if history else None)
        offset += len(records)
    return merge


def stored(backend: SqlBackend, table: str = "Accounts") -> list[tuple[Any, ...]]:
    rows = backend.execute(f'SELECT "Id", "Note", "Tags" FROM {quote(table)} ORDER BY "Id", "Note"')
    return [
        (key, _plain(note), None if tags is None else [_plain(t) for t in tags]) for key, note, tags in rows
    ]


def _plain(value: Any) -> Any:
    return bytes(value) if isinstance(value, memoryview) else value


def test_a_column_changed_from_string_to_bytes_and_back_follows_spanner(backend: SqlBackend) -> None:
    """STRING, then a batch of both types, then STRING again once the row holding bytes that are
    not UTF-8 is deleted (Spanner refuses the change back while a row holds such bytes): the
    column is BYTES with every text as its UTF-8, then STRING. DuckDB still stores a deleted row
    until a checkpoint, so a conversion in place (``ALTER COLUMN … TYPE``) would fail on it."""
    batches: list[list[Change]] = [
        [
            ("STRING", "INSERT", "a", "x", ["é", None]),
            ("STRING", "INSERT", "b", "y", []),
            ("STRING", "INSERT", "c", "z", None),
        ],
        [  # one batch of both types: staged as BYTES
            ("STRING", "UPDATE", "b", "y2", []),
            ("BYTES", "INSERT", "d", b"\xff", [b"\x00"]),
            ("BYTES", "UPDATE", "a", b"hi", [b"\xc3\xa9", None]),
        ],
        [("BYTES", "DELETE", "d", None, None)],
        [("STRING", "UPDATE", "c", "zz", ["ü"])],
    ]
    merged_batches(backend, batches[:1], history=False)
    assert stored(backend) == [("a", "x", ["é", None]), ("b", "y", []), ("c", "z", None)]

    merged_batches(backend, batches[:2], history=False)  # its first batch is a replay: skipped
    assert stored(backend) == [
        ("a", b"hi", [b"\xc3\xa9", None]),
        ("b", b"y2", []),
        ("c", b"z", None),
        ("d", b"\xff", [b"\x00"]),
    ]

    merged_batches(backend, batches, history=False)
    assert stored(backend) == [("a", "hi", ["é", None]), ("b", "y2", []), ("c", "zz", ["ü"])]


def test_the_streams_history_follows_the_column_too(backend: SqlBackend) -> None:
    """With history kept for streams, the earlier versions and the inserts are converted with
    the rows: a stream across the change reads one type."""
    merged_batches(
        backend,
        [
            [("STRING", "INSERT", "a", "x", ["é", None]), ("STRING", "INSERT", "b", "y", [])],
            [("BYTES", "INSERT", "c", b"c", [b"\xc3\xbc"]), ("BYTES", "UPDATE", "a", b"hi", [])],
            [("STRING", "UPDATE", "b", "y2", None)],
        ],
        history=True,
    )

    assert stored(backend) == [("a", "hi", []), ("b", "y2", None), ("c", "c", ["ü"])]
    assert stored(backend, "Accounts$history") == [("a", "x", ["é", None]), ("b", "y", [])]
    assert stored(backend, "Accounts$inserts") == [("a", "x", ["é", None]), ("b", "y", []), ("c", "c", ["ü"])]


def test_history_holding_bytes_that_are_not_utf8_stops_the_change_back_in_one_line(
    backend: SqlBackend,
) -> None:
    """An insert of bytes that are not UTF-8, kept for streams after its row was deleted, cannot
    become a STRING: the batch fails naming table and column, and is not committed."""
    first: list[list[Change]] = [
        [("STRING", "INSERT", "a", "x", None)],
        [("BYTES", "INSERT", "d", b"\xff", None)],
        [("BYTES", "DELETE", "d", None, None)],
    ]
    merge = merged_batches(backend, first, history=True)

    with pytest.raises(
        ReplicaQueryError, match="table Accounts: column Note is STRING in Spanner now, and converting"
    ):
        merged_batches(backend, [*first, [("STRING", "UPDATE", "a", "y", None)]], history=True)
    assert merge.last_batch("retype") == 2
    assert stored(backend) == [("a", b"x", None)]


@pytest.mark.parametrize("history", [False, True])
@pytest.mark.parametrize(
    ("new", "described"), [(("STRING", "12", "3"), '"string"'), (("FLOAT64", 7.25, 0.5), '"double"')]
)
def test_a_later_batch_of_another_type_stops_that_table_and_the_others_go_on(
    backend: SqlBackend, history: bool, new: tuple[str, Value, Value], described: str
) -> None:
    """A column the replica holds as INT64 (BIGINT) whose events bring another type in a later
    batch: no change Spanner makes in place, so a table dropped and created again under its name
    and key. No batch could ever merge it, so the batch stops that table (``cdc$stopped``: the
    reason names column, table and both types) and commits: its rows stay as they were, its later
    changes are counted and not applied, and another table's changes in the same batches are.
    Before, the database refused STRING in its own words (CASE types bigint and text cannot be
    matched) and stored FLOAT64 rounded into the BIGINT column (7.25 as 7: checked). With its
    replica tables dropped, the table starts over with the new type."""
    code, value, tag = new
    ledger = ChangeFactory(table="Ledger", columns=[("Id", "STRING", True), ("N", "INT64", False)])
    batches = [
        [record("INT64", "INSERT", "a", "1", ["2", None])],
        [record(code, "INSERT", "b", value, [tag]), ledger.record("INSERT", {"Id": "l"}, {"N": "5"})],
        [record(code, "UPDATE", "b", value, None), ledger.record("UPDATE", {"Id": "l"}, {"N": "6"})],
    ]
    merge = merged_records(backend, batches, history=history)
    int8 = "bigint" if backend.dialect == "duckdb" else "int8"

    assert merge.last_batch("retype") == 2
    assert stored(backend) == [("a", 1, [2, None])]
    assert backend.execute('SELECT "Id", "N" FROM "Ledger"') == [("l", 6)]
    [stopped] = stopped_tables(backend).values()
    assert (stopped.table, stopped.skipped_events) == ("Accounts", 2)
    assert stopped.since_micros == batches[1][0]["commit_timestamp"]
    assert re.match(
        f"column Note is {described} in the events of Accounts .* as {int8}: not a ", stopped.reason
    )

    for table in (
        "Accounts",
        "Accounts$deleted",
        *(("Accounts$history", "Accounts$inserts") if history else ()),
    ):
        backend.execute(f"DROP TABLE {quote(table)}")
    merged_records(backend, [*batches, [record(code, "INSERT", "c", value, [tag])]], history=history)
    assert stored(backend) == [("c", value, [tag])]
    assert stopped_tables(backend) == {}


def test_every_type_the_replica_declares_is_its_own_catalog_type(backend: SqlBackend) -> None:
    """A table of every column type a writer schema can bring, arrays too, created by the merge
    and merged again in a later batch: each stored type is what the backend says its declared
    type is (else a batch after the first would stop as a change of type)."""
    factory = ChangeFactory(
        columns=[("Id", "STRING", True), *((name, code, False) for name, code in _every_type().items())]
    )

    def created(mod: str) -> dict[str, Any]:
        written = factory.record(mod, {"Id": "a"}, {})
        for column in written["column_types"]:
            if column["name"].startswith("A"):
                column["type"] = {"code": "ARRAY", "array_element_type": column["type"]}
        return written

    merged_records(backend, [[created("INSERT")], [created("UPDATE")]], history=True)
    assert backend.execute('SELECT count(*) FROM "Accounts"') == [(1,)]


def _every_type() -> dict[str, str]:
    """Column name → Spanner type code, for every type the producer writes, each also as an
    array (a name starting with A)."""
    codes = ["BOOL", "INT64", "FLOAT64", "FLOAT32", "NUMERIC", "PG_NUMERIC", "STRING", "JSON", "PG_JSONB"]
    codes += ["BYTES", "DATE", "TIMESTAMP", "PROTO", "ENUM", "UUID"]
    return {f"{prefix}{code}": code for code in codes for prefix in ("S", "A")}


def test_stage_tables_a_task_loaded_before_the_change_are_taken_as_bytes(stack: EmbeddedStack) -> None:
    """PostgreSQL, stage rows loaded by the tasks (stage/loaded.py): task 0 loaded the table's
    events of STRING (a stage table of TEXT), task 1 those after the change to BYTES. The merge
    converts task 0's values as it takes them."""
    dsn = fresh_postgres_database(stack.endpoint("postgres"))
    keys = 5_000  # enough for a task to load its part (stage.loaded.TASKS_LOAD_FROM_ROWS)
    tables = StagedTables(dsn, "query", 3)
    texts = [record("STRING", "INSERT", f"k{k:05d}", "é", ["a"]) for k in range(keys)]
    data = [record("BYTES", "INSERT", f"m{k:05d}", b"\xff", [b"\x00"]) for k in range(keys)]
    [before] = tables.load(0, parts(texts, 0))
    [after] = tables.load(1, parts(data, keys))
    backend = PostgresBackend(dsn)
    try:
        merge = ReplicaMerge(backend)
        with merge.batch("query", 3):
            merge.write(combined([before, after]))
        rows = stored(backend)
    finally:
        backend.close()

    assert rows == [
        *((f"k{k:05d}", "é".encode(), [b"a"]) for k in range(keys)),
        *((f"m{k:05d}", b"\xff", [b"\x00"]) for k in range(keys)),
    ]


def test_late_texts_from_before_the_change_to_bytes_do_not_change_the_column_back(
    backend: SqlBackend,
) -> None:
    """Without whole transactions a batch is not cut in commit order: a partition that lagged
    brings a STRING change committed before the column became BYTES after the replica took
    BYTES. It is written as its UTF-8 and the column stays BYTES (changed back, it would fail on
    the bytes that are not UTF-8, at every replay); a newer STRING change takes it back."""
    start = 1_760_000_000_000_000
    first = [record("STRING", "INSERT", "a", "x", None, commit_micros=start)]
    then = [record("BYTES", "INSERT", "b", b"\xff", [b"\x00"], commit_micros=start + 3)]
    late = [record("STRING", "INSERT", "c", "é", ["ü"], commit_micros=start + 2)]
    merged_records(backend, [first, then, late], history=False)
    assert stored(backend) == [
        ("a", b"x", None),
        ("b", b"\xff", [b"\x00"]),
        ("c", "é".encode(), ["ü".encode()]),
    ]

    deleted = [record("BYTES", "DELETE", "b", None, None, commit_micros=start + 4)]
    newer = [record("STRING", "UPDATE", "a", "y", None, commit_micros=start + 5)]
    merged_records(backend, [first, then, late, deleted, newer], history=False)
    assert stored(backend) == [("a", "y", None), ("c", "é", ["ü"])]


def test_a_key_column_changed_between_string_and_bytes_keeps_each_row_its_key(backend: SqlBackend) -> None:
    """Spanner changes a key column's type too (the emulator takes ``ALTER COLUMN Id BYTES``).
    The replica's rows and tombstones are converted, so changes after it find their rows: an
    update of the key's bytes updates the row, a delete deletes it; and back to STRING."""

    def keyed(code: str, mod: str, key: Value, balance: int | None = None) -> dict[str, Any]:
        factory = ChangeFactory(columns=[("Id", code, True), ("Balance", "INT64", False)])
        spelled = base64.b64encode(key).decode() if isinstance(key, bytes) else key
        values = {} if balance is None else {"Balance": str(balance)}
        return factory.record(mod, {"Id": spelled}, values)

    batches = [
        [keyed("STRING", "INSERT", "a", 1), keyed("STRING", "INSERT", "b", 2)],
        [
            keyed("BYTES", "UPDATE", b"a", 3),
            keyed("BYTES", "INSERT", b"\xc3\xa9", 4),
            keyed("BYTES", "DELETE", b"b"),
        ],
        [keyed("BYTES", "DELETE", b"\xc3\xa9")],
        [
            keyed("STRING", "INSERT", "c", 5),
            keyed("STRING", "UPDATE", "a", 6),
            keyed("STRING", "INSERT", "b", 7),
        ],
    ]
    merged_records(backend, batches[:2], history=False)
    assert _rows(backend, "Accounts") == [(b"a", 3), (b"\xc3\xa9", 4)]
    assert _rows(backend, "Accounts$deleted", '"Id"') == [(b"b",)]

    merged_records(backend, batches, history=False)
    assert _rows(backend, "Accounts") == [("a", 6), ("b", 7), ("c", 5)]
    assert _rows(backend, "Accounts$deleted", '"Id"') == [("é",)]


def _rows(backend: SqlBackend, table: str, columns: str = '"Id", "Balance"') -> list[tuple[Any, ...]]:
    return [
        tuple(_plain(v) for v in row)
        for row in backend.execute(f"SELECT {columns} FROM {quote(table)} ORDER BY 1")
    ]
