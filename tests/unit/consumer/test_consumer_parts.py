"""Consumer parts that need no services: the uuid memory, configuration, error extraction, the
changelog's written-rows check and staged files, the quarantine's staged files and what of it
reaches the driver, the schema topic's bound."""

from __future__ import annotations

import json
import logging
import re
import struct
import threading
import time
from collections import Counter
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spanner_cdc.common.config import ConfigError
from spanner_cdc.consumer.batch import Outline, check_written, per_table
from spanner_cdc.consumer.config import ConsumerConfig
from spanner_cdc.consumer.decode.change_rows import SOURCE_METADATA, TableChanges
from spanner_cdc.consumer.decode.decoded import DecodedBatch, Quarantined, Unknown
from spanner_cdc.consumer.decode.driver import BrokerPartitions
from spanner_cdc.consumer.decode.gate import MAX_DETAIL_CHARS, DecodeContext, MessageReader
from spanner_cdc.consumer.decode.outline_rows import COORDINATES, outline_batch
from spanner_cdc.consumer.decode.schema_topic import SchemaTopic
from spanner_cdc.consumer.dedupe import DeliveredChanges
from spanner_cdc.consumer.errors import ChangelogShortfallError
from spanner_cdc.consumer.locations import Location
from spanner_cdc.consumer.sinks.changelog import COORDINATES as CHANGELOG_COORDINATES
from spanner_cdc.consumer.sinks.changelog import DISTINCT_PER_EVENT, ChangelogSink
from spanner_cdc.consumer.sinks.quarantine import QuarantineSink
from spanner_cdc.consumer.spark.graceful_stop import (
    BatchGate,
    StoppingBeforeBatchError,
    StopRequest,
    python_error,
)
from spanner_cdc.schemas.errors import DecodeError
from spanner_cdc.schemas.table import TableSchema
from spanner_cdc.schemas.timestamps import now_micros
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.schemas.watermark import Watermark
from spanner_cdc.schemas.wire import MAGIC, WriterSchema
from testkit.synthetic import ChangeFactory
from tests.unit.consumer.sinks.replica.test_replica_staging import decoded

pytestmark = pytest.mark.unit
HOUR = 3_600_000_000


def changes(uuids: list[str], commit_micros: list[int]) -> pa.Table:
    """A batch's events as deduplication sees them (its outline's columns)."""
    return pa.table({"uuid": uuids, "commit_micros": pa.array(commit_micros, pa.int64())})


def memory_in(directory: Path, horizon_micros: int = HOUR) -> DeliveredChanges:
    return DeliveredChanges(Location.local(directory / "dedupe"), horizon_micros, directory / "local")


def fresh(memory: DeliveredChanges, batch_id: int, uuids: list[str], commit_micros: list[int]) -> list[bool]:
    return list(memory.fresh(batch_id, changes(uuids, commit_micros)).to_pylist())


def test_memory_keeps_first_occurrences_and_forgets_nothing_within_the_horizon(tmp_path: Path) -> None:
    memory = memory_in(tmp_path)
    assert fresh(memory, 0, ["a", "b", "a"], [10, 20, 10]) == [True, True, False]
    memory.remember(0, changes(["a", "b"], [10, 20]))
    assert memory.committed(0)
    assert fresh(memory, 1, ["b", "c"], [20, 30]) == [False, True]


def test_a_replayed_batch_gets_the_answers_of_its_first_attempt(tmp_path: Path) -> None:
    memory = memory_in(tmp_path)
    memory.remember(0, changes(["a"], [10]))
    first = fresh(memory, 1, ["a", "b"], [10, 20])
    memory.remember(1, changes(["b"], [20]))  # the crash came after this, before Spark committed batch 1
    assert fresh(memory, 1, ["a", "b"], [10, 20]) == first == [False, True]
    assert not memory.committed(2)


def test_entries_behind_the_horizon_are_pruned(tmp_path: Path) -> None:
    memory = memory_in(tmp_path, horizon_micros=100)
    memory.remember(0, changes(["old"], [1_000]))
    memory.remember(1, changes(["new"], [2_000]))
    assert memory.oldest_remembered(2) == 1_900
    assert fresh(memory, 2, ["old", "new"], [1_000, 2_000]) == [True, False]


def test_a_future_commit_time_does_not_shrink_the_window(tmp_path: Path) -> None:
    """One event stamped 59 minutes ahead made the memory prune everything older than a minute
    ago: 100 re-sent duplicates of the last ten minutes were all delivered again."""
    now = now_micros()
    recent = [f"r{n}" for n in range(100)]
    times = [now - 600_000_000 + n for n in range(100)]
    memory = memory_in(tmp_path)
    memory.remember(0, changes(recent, times))
    memory.remember(1, changes(["forged"], [now + 59 * 60_000_000]))
    assert fresh(memory, 2, recent, times) == [False] * 100


def test_the_memory_survives_a_reopen(tmp_path: Path) -> None:
    memory = memory_in(tmp_path)
    memory.remember(0, changes(["a"], [10]))
    memory.close()
    assert fresh(memory_in(tmp_path), 1, ["a"], [10]) == [False]


def test_an_empty_batch_is_remembered(tmp_path: Path) -> None:
    memory = memory_in(tmp_path)
    assert fresh(memory, 0, [], []) == []
    memory.remember(0, changes([], []))
    assert memory.committed(0)


def test_the_memory_is_a_file_per_batch_and_files_behind_the_horizon_go(tmp_path: Path) -> None:
    memory = memory_in(tmp_path, horizon_micros=100)
    memory.remember(0, changes(["old"], [1_000]))
    memory.remember(1, changes([], []))
    memory.remember(2, changes(["new"], [2_000]))
    assert [p.name for p in (tmp_path / "dedupe").iterdir()] == ["batch-000000000002-newest-2000.parquet"]
    memory.close()
    assert not list((tmp_path / "local").iterdir()), "the working copy was left behind"
    reopened = memory_in(tmp_path, horizon_micros=100)
    assert reopened.committed(2) and not reopened.committed(3)
    assert fresh(reopened, 3, ["new", "old"], [2_000, 1_000]) == [False, True]
    assert reopened.oldest_remembered(3) == 1_900


def test_a_replayed_batch_replaces_its_file(tmp_path: Path) -> None:
    memory = memory_in(tmp_path)
    memory.remember(0, changes(["a"], [10]))
    memory.remember(1, changes(["b"], [20]))
    memory.remember(1, changes(["b", "c"], [20, 30]))
    names = sorted(p.name for p in (tmp_path / "dedupe").iterdir())
    assert names == ["batch-000000000000-newest-10.parquet", "batch-000000000001-newest-30.parquet"]
    assert fresh(memory, 2, ["a", "b", "c", "d"], [10, 20, 30, 40]) == [False, False, False, True]


def test_an_earlier_version_s_memory_is_read_once_into_batch_files(tmp_path: Path) -> None:
    """Until this version the memory was one DuckDB file; upgrading forgets nothing of it."""
    (tmp_path / "dedupe").mkdir()
    with duckdb.connect(str(tmp_path / "dedupe" / "dedupe.duckdb")) as old:
        old.execute("CREATE TABLE delivered (commit_micros BIGINT, uuid VARCHAR, batch_id BIGINT)")
        old.execute("CREATE TABLE batches (batch_id BIGINT, newest_micros BIGINT)")
        old.execute("INSERT INTO delivered VALUES (10, 'a', 4), (20, 'b', 5)")
        old.execute("INSERT INTO batches VALUES (4, 10), (5, 20)")
    memory = memory_in(tmp_path)
    assert memory.committed(5) and not memory.committed(6)
    assert fresh(memory, 6, ["a", "b", "c"], [10, 20, 30]) == [False, False, True]
    assert sorted(p.name for p in (tmp_path / "dedupe").iterdir()) == [
        "batch-000000000004-newest-10.parquet",
        "batch-000000000005-newest-20.parquet",
    ]


def test_the_topic_pattern_leaves_out_control_topics(tmp_path: Path) -> None:
    config = ConsumerConfig("h:1", "Bank.Stream", str(tmp_path))
    pattern = re.compile(config.topics.event_pattern)
    assert pattern.fullmatch("Bank.Stream.Accounts")
    assert not pattern.fullmatch("Bank.Stream._schemas")
    assert not pattern.fullmatch("BankxStream.Accounts")
    assert pattern.fullmatch("Bank.Stream.sales.Orders")  # a table in a named schema
    assert not pattern.fullmatch("Bank.Stream.Test._schemas")  # the prefix Bank.Stream.Test's
    # Spark's subscribePattern finds the pattern anywhere in a name (Matcher.find): anchored, it
    # leaves out the prefix's control topics, whose names hold the prefix too.
    for control in ("_spanner-cdc.Bank.Stream.schemas", "_spanner-cdc.Bank.Stream.watermarks"):
        assert not pattern.search(control)
    assert not pattern.search("Old.Bank.Stream.Accounts")


def test_postgres_replica_needs_a_dsn(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--postgres-dsn"):
        ConsumerConfig("h:1", "P", str(tmp_path), replica="postgres")


def test_the_python_error_is_found_inside_sparks_report() -> None:
    report = (
        "[STREAM_FAILED] Query terminated with exception: Traceback (most recent call last):\n"
        '  File "x.py", line 1, in call\n'
        "spanner_cdc.consumer.errors.BadMessageError: T.Accounts[2] offset 0: bad-magic\n"
        " SQLSTATE: 39000"
    )
    assert (
        python_error(report)
        == "spanner_cdc.consumer.errors.BadMessageError: T.Accounts[2] offset 0: bad-magic"
    )


def test_an_exception_in_a_task_is_its_own_line_whatever_its_class_is_called() -> None:
    """A task's exception as Spark 4 reports it (a mapInArrow task, scratch): pyarrow's
    ArrowInvalid, not the line Spark puts before the traceback."""
    report = (
        "[STREAM_FAILED] Query terminated with exception: "
        "An exception was thrown from the Python worker:\n"
        "Traceback (most recent call last):\n"
        '  File "/tmp/scratch/pyexc.py", line 7, in task\n'
        '    pa.array([b"\\xff"], pa.binary()).cast(pa.string())\n'
        '  File "pyarrow/error.pxi", line 92, in pyarrow.lib.check_status\n'
        "pyarrow.lib.ArrowInvalid: Invalid UTF8 payload\n"
        "\n\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(...)\n"
        "Caused by: org.apache.spark.SparkException: Job aborted due to stage failure\n"
    )
    assert python_error(report) == "pyarrow.lib.ArrowInvalid: Invalid UTF8 payload"


def test_a_failed_spark_job_of_a_batch_is_the_line_of_its_java_cause() -> None:
    """A batch's Spark job failed in the JVM (Kafka no longer has offsets the batch reads): the
    Python side sees only py4j's wrapper; the line is the first Java cause that says what."""
    report = (
        "[STREAM_FAILED] Query terminated with exception: Traceback (most recent call last):\n"
        '  File "batch.py", line 9, in call\n'
        "py4j.protocol.Py4JJavaError: An error occurred while calling o348.getResult.\n"
        ": org.apache.spark.SparkException: Exception thrown in awaitResult: \n"
        "\tat org.apache.spark.util.SparkThreadUtils$.awaitResult(SparkThreadUtils.scala:56)\n"
        "Caused by: org.apache.spark.SparkException: Job aborted due to stage failure\n"
        "Caused by: org.apache.spark.sql.kafka010.KafkaIllegalStateException: Some data may have been "
        "lost because they are not available in Kafka any more;\n"
        "Caused by: org.apache.kafka.clients.consumer.OffsetOutOfRangeException: Fetch position "
        "out of range\n"
    )
    assert python_error(report) == (
        "Some data may have been lost because they are not available in Kafka any more;"
    )


def test_a_closed_gate_waits_for_the_running_batch_and_refuses_the_next() -> None:
    gate, request = BatchGate(), StopRequest()
    finished: list[int] = []

    def batch_seven() -> None:
        with gate.batch(7):
            time.sleep(0.3)
            finished.append(7)

    running = threading.Thread(target=batch_seven)
    running.start()
    time.sleep(0.1)
    assert gate.close(request.urgent) is None  # returns once batch 7 has returned
    assert finished == [7]
    with pytest.raises(StoppingBeforeBatchError), gate.batch(8):
        pytest.fail("batch 8 ran")
    assert gate.refused == 8
    running.join()


def test_a_second_signal_stops_inside_the_running_batch() -> None:
    gate, request = BatchGate(), StopRequest()
    request.signal()
    assert request.requested.is_set() and not request.urgent.is_set()
    request.signal()
    with gate.batch(3):
        assert gate.close(request.urgent) == 3


def test_broker_partition_counts_are_kept_and_read_again_when_a_watermark_needs_it() -> None:
    """The broker's metadata is read once for many batches; a watermark naming a topic created
    since is checked against fresh counts; a batch of forged watermarks costs one read."""
    broker = {"P.a": 2}
    reads: list[int] = []

    def read() -> dict[str, int]:
        reads.append(1)
        return dict(broker)

    partitions = BrokerPartitions(read)
    now = 2_000_000_000_000_000
    for _ in range(3):
        partitions.start_batch()
        partitions.check(Watermark("s", now, {"P.a": 2}), "P.a", 1, now)
    assert len(reads) == 1
    broker["P.b"] = 4
    partitions.start_batch()
    partitions.check(Watermark("s", now, {"P.a": 2, "P.b": 4}), "P.b", 3, now)
    assert len(reads) == 2
    partitions.start_batch()
    for _ in range(100):
        with pytest.raises(DecodeError, match="20000 partitions"):
            partitions.check(Watermark("s", now, {"P.a": 20_000}), "P.a", 0, now)
    assert len(reads) == 3
    expired = BrokerPartitions(read, max_age_seconds=0)
    expired.check(Watermark("s", now, {"P.a": 2}), "P.a", 0, now)
    expired.check(Watermark("s", now, {"P.a": 2}), "P.a", 0, now)
    assert len(reads) == 5


def test_the_changelog_counts_a_staged_batch_per_table_from_its_files(tmp_path: Path) -> None:
    staged = ChangelogSink(Location.local(tmp_path / "changelog")).staging(7)
    for table, commit_date, part, rows in [
        ("Accounts", "2026-11-25", 0, 3),
        ("Accounts", "2026-11-26", 0, 2),
        ("Accounts", "2026-11-26", 1, 4),
        ("Odd/Name %", "2026-11-26", 1, 1),
    ]:
        directory = Path((staged.table_dir(table) / f"commit_date={commit_date}").path)
        directory.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"n": list(range(rows))}), directory / f"batch-7-part-{part}.parquet")
    assert staged.rows_per_table() == Counter({"Accounts": 9, "Odd/Name %": 1})
    assert ChangelogSink(Location.local(tmp_path / "nothing")).rows_per_table() == Counter()


def test_dropping_messages_from_a_staged_file_keeps_the_rest_in_order(tmp_path: Path) -> None:
    """What deduplication dropped leaves the staged files; the rows left keep the file's order
    (sort_keys order, not offset order) and every column; untouched files are not rewritten."""
    staged = ChangelogSink(Location.local(tmp_path / "changelog")).staging(3)
    directory = staged.table_dir("Accounts") / "commit_date=2026-11-26"
    Path(directory.path).mkdir(parents=True)
    offsets = [9, 2, 7, 4, 0, 5]  # the rows' order in the file
    rows = pa.table(
        {
            "Id": pa.array([f"k{o}" for o in offsets]),
            "kafka$topic": pa.array(["P.Accounts"] * 5 + ["P.Other"]),
            "kafka$partition": pa.array([0, 1, 0, 1, 0, 0], pa.int32()),
            "kafka$offset": pa.array(offsets, pa.int64()),
        }
    )
    file, untouched, emptied = (directory / f"batch-3-part-{n}.parquet" for n in range(3))
    for path in (file, untouched, emptied):
        pq.write_table(rows, path.path)
    untouched_before = Path(untouched.path).stat().st_mtime_ns

    def messages(*coordinates: tuple[str, int, int]) -> pa.Table:
        topics, partitions, offsets = zip(*coordinates, strict=True)
        return pa.table(
            {
                "topic": pa.array(topics),
                "partition": pa.array(partitions, pa.int32()),
                "offset": pa.array(offsets, pa.int64()),
            }
        )

    # (P.Accounts, 1, 7) is not in the file (7 is in partition 0), nor is (P.Accounts, 0, 5).
    ChangelogSink.drop_messages(
        file, messages(("P.Accounts", 1, 2), ("P.Accounts", 0, 0), ("P.Accounts", 1, 7), ("P.Accounts", 0, 5))
    )
    assert pq.read_table(file.path).to_pydict() == rows.take([0, 2, 3, 5]).to_pydict()
    ChangelogSink.drop_messages(untouched, messages(("P.Other", 1, 5)))
    assert Path(untouched.path).stat().st_mtime_ns == untouched_before
    ChangelogSink.drop_messages(
        emptied,
        messages(
            *zip(rows["kafka$topic"].to_pylist(), rows["kafka$partition"].to_pylist(), offsets, strict=True)
        ),
    )
    assert not emptied.is_file()
    assert staged.files() == [file, untouched]
    assert staged.rows_per_table() == Counter({"Accounts": 4 + 6})


def test_the_changelog_writes_the_values_each_event_has_its_own_of_without_a_dictionary(
    tmp_path: Path,
) -> None:
    """uuid, commit time, transaction and offset are plain in the changelog's files (a
    dictionary of them Parquet builds only to abandon it); every other column that can have one
    keeps its dictionary, also in a file rewritten without the duplicates; the rows read back
    as written."""
    factory = ChangeFactory()
    events = decoded(
        [factory.record("INSERT", {"Id": f"k{n}"}, {"Balance": str(n), "Note": "x"}) for n in range(20)]
    )
    changes = TableChanges("Accounts", events)
    sink = ChangelogSink(Location.local(tmp_path / "changelog"))
    sink.write_table(4, changes, 0, 0)
    [file] = sink.files()

    def check_encodings() -> None:
        row_group = pq.ParquetFile(file.path).metadata.row_group(0)
        columns = [row_group.column(i) for i in range(row_group.num_columns)]
        encoded = {c.path_in_schema: "RLE_DICTIONARY" in c.encodings for c in columns}
        assert set(DISTINCT_PER_EVENT) <= encoded.keys()
        assert not any(encoded[path] for path in DISTINCT_PER_EVENT)
        named = (f"{SOURCE_METADATA}.table", f"{SOURCE_METADATA}.changed_columns.list.element")
        for path in ("Note", "change$type", "change$row_id", "envelope$object", *named):
            assert encoded[path], path

    check_encodings()
    duplicate = changes.changelog().slice(0, 1).select(list(CHANGELOG_COORDINATES))
    ChangelogSink.drop_messages(file, duplicate.rename_columns(list(COORDINATES)))
    check_encodings()
    assert pq.read_table(file.path).to_pylist() == changes.changelog().slice(1).to_pylist()


def test_a_batch_quarantine_is_what_its_last_attempt_staged_and_refuted(tmp_path: Path) -> None:
    """Tasks stage their refused messages, the driver publishes them with the watermarks it
    refuted; a replay split into other tasks leaves only its own files, and staging is emptied."""
    sink = QuarantineSink(Location.local(tmp_path / "quarantine"))

    def refused(offset: int, reason: str) -> Quarantined:
        return Quarantined("P.Accounts", 0, offset, b"k", b"\x00garbage", reason, "detail")

    def published() -> dict[str, list[int]]:
        return {
            file.name: pq.read_table(file.path).column("offset").to_pylist()
            for file in sink.root.files("*.parquet")
        }

    # A first attempt: tasks 0 and 1 refused messages, task 2 none; one watermark refuted.
    QuarantineSink.stage(sink.staging(4), 4, 0, [refused(3, "corrupt"), refused(9, "truncated")])
    QuarantineSink.stage(sink.staging(4), 4, 1, [refused(12, "corrupt")])
    QuarantineSink.stage(sink.staging(4), 4, 2, [])
    sink.publish(4, [refused(20, "watermark-beyond-partitions")])
    assert published() == {
        "batch-000000000004-part-00000.parquet": [3, 9],
        "batch-000000000004-part-00001.parquet": [12],
        "batch-000000000004.parquet": [20],
    }
    assert not sink.staging(4).is_dir()
    row = pq.read_table((sink.root / "batch-000000000004-part-00000.parquet").path).to_pylist()[0]
    assert (row["key"], row["value"], row["reason"]) == (b"k", b"\x00garbage", "corrupt")

    # Its replay, read by one task after a schema was learnt: nothing else of batch 4 stays.
    QuarantineSink.stage(sink.staging(4), 4, 0, [refused(9, "truncated")])
    QuarantineSink.stage(sink.staging(4), 4, 5, [refused(30, "corrupt")])
    sink.discard_staged(4)
    QuarantineSink.stage(sink.staging(4), 4, 0, [refused(9, "truncated")])
    sink.remove_batch(4)  # the first batch after a start
    sink.publish(4, [])
    QuarantineSink.stage(sink.staging(5), 5, 0, [refused(40, "corrupt")])
    sink.publish(5, [])
    assert published() == {
        "batch-000000000004-part-00000.parquet": [9],
        "batch-000000000005-part-00000.parquet": [40],
    }


def test_the_driver_learns_from_the_names_quarantined_messages_give_never_from_their_bytes() -> None:
    """Quarantined bytes stay with the task; what the driver may learn travels as a name, each
    name once however many messages (and tasks) gave it."""
    fingerprint = Unknown(fingerprint=0xF0000000000000AA)  # above 2**63: hex, not a Spark long
    schema_id, version = Unknown(schema_id=7), Unknown(table_version=("Accounts", "ab" * 32))

    def refused(offset: int, reason: str, unknown: Unknown | None) -> Quarantined:
        return Quarantined("P.A", 0, offset, b"k", b"\x00" * 1000, reason, "detail", unknown)

    tasks = [
        [
            refused(1, "unknown-fingerprint", fingerprint),
            refused(2, "unknown-fingerprint", fingerprint),
            refused(3, "corrupt", None),
            refused(4, "unresolved-schema-id", schema_id),
        ],
        [refused(5, "unknown-table-version", version), refused(6, "unknown-fingerprint", fingerprint)],
    ]
    outline_table = pa.Table.from_batches([outline_batch(DecodedBatch([], [], task)) for task in tasks])
    assert outline_table.column("value").null_count == outline_table.num_rows
    found = Outline(outline_table)
    assert sorted(found.unknown(), key=repr) == sorted([fingerprint, schema_id, version], key=repr)
    assert [(q.offset, q.reason, q.value) for q in found.quarantined()][2:4] == [
        (3, "corrupt", None),
        (4, "unresolved-schema-id", None),
    ]


def test_the_schema_topic_keeps_at_most_its_bound_of_writer_schemas(caplog: pytest.LogCaptureFixture) -> None:
    """A flood of valid-looking schemas stops at ``--max-writer-schemas``: later ones are not
    kept (their events are quarantined as unknown-fingerprint), the kept ones stay readable and
    a lookalike of one of them is still refused."""
    key = {"name": "odd name", "type": {"code": "INT64"}, "is_primary_key": True, "ordinal_position": 1}
    tables = [TableSchema.from_column_types(f"T{i}", [key]) for i in range(4)]
    writers = [WriterSchema.from_schema(table.event_schema) for table in tables]
    topic = SchemaTopic({}, "P", max_schemas=3)  # the watermark's and two more
    with caplog.at_level(logging.WARNING, logger="spanner_cdc"):
        for writer in [*writers, writers[0]]:
            topic.accept(writer.fingerprint_hex.encode(), writer.schema_json.encode())
    kept = [w.fingerprint for w in writers if w.fingerprint in topic.texts]
    assert kept == [writers[0].fingerprint, writers[1].fingerprint]
    assert topic.why_unreadable(writers[2].fingerprint) is None  # unknown, as if never published
    assert "more than 3 writer schemas (--max-writer-schemas)" in caplog.text

    lookalike = json.loads(writers[1].schema_json)
    lookalike["fields"][-1]["doc"] = "ignored"  # not what makes a lookalike: the reading form is the same
    topic.accept(writers[1].fingerprint_hex.encode(), json.dumps(lookalike).encode())
    assert topic.why_unreadable(writers[1].fingerprint) is None
    renamed = writers[1].schema_json.replace('"sqlName":"odd name"', '"sqlName":"odd_name"', 1)
    assert renamed != writers[1].schema_json
    topic.accept(writers[1].fingerprint_hex.encode(), renamed.encode())
    assert topic.why_unreadable(writers[1].fingerprint) == (
        "ambiguous-schema",
        f"two valid schemas with fingerprint {writers[1].fingerprint_hex} read differently",
    )


def test_a_quarantine_detail_reaches_the_driver_cut_to_a_bound() -> None:
    """A refused schema's reason can quote what it refused; the outline carries at most
    MAX_DETAIL_CHARS of it per message."""
    fingerprint = 0xAB
    context = DecodeContext(Topics("P"), 0, unreadable={fingerprint: ("rejected-schema", "x" * 50_000)})
    value = MAGIC + struct.pack("<Q", fingerprint) + b"\x00"
    rows = pa.table({"key": [b"k"], "value": [value], "topic": ["P.A"], "partition": [0], "offset": [7]})
    [refused] = MessageReader(context).read(rows).quarantined
    assert (refused.reason, refused.detail) == ("rejected-schema", "x" * MAX_DETAIL_CHARS)


def test_a_changelog_that_differs_from_what_the_batch_kept_fails_the_batch() -> None:
    check_written(3, Counter({"A": 2, "B": 1}), Counter({"B": 1, "A": 2}))
    check_written(3, Counter({"A": 0}), Counter())
    with pytest.raises(ChangelogShortfallError, match=r"batch 3: .*'A': kept 2, written 1"):
        check_written(3, Counter({"A": 2, "B": 1}), Counter({"A": 1, "B": 1}))
    with pytest.raises(ChangelogShortfallError, match=r"'C': kept 0, written 5"):
        check_written(3, Counter({"A": 2}), Counter({"A": 2, "C": 5}))
    assert per_table(pa.table({"object": ["B", "A", "B"]})) == Counter({"B": 2, "A": 1})


def test_no_schema_topic_record_can_stop_the_consumer(caplog: pytest.LogCaptureFixture) -> None:
    """The schema topic is read from its start at every start: a record whose reading raised
    (a named type defined twice: fastavro's SchemaParseException; a table version nested ~990
    deep: RecursionError) stopped every future start. Each is refused with one line."""
    key = {"name": "Id", "type": {"code": "INT64"}, "is_primary_key": True, "ordinal_position": 1}
    real = WriterSchema.from_schema(TableSchema.from_column_types("T", [key]).event_schema)
    twice = json.loads(real.schema_json)
    twice["fields"].append({"name": "again", "type": "Payload"})
    twice["fields"].append({"name": "twice", "type": {"type": "record", "name": "Payload", "fields": []}})
    deep = ("[" * 990 + "]" * 990).encode()
    topic = SchemaTopic({}, "P")
    with caplog.at_level(logging.WARNING, logger="spanner_cdc"):
        topic.accept(real.fingerprint_hex.encode(), json.dumps(twice).encode())
        topic.accept(b"version/T/abc", deep)
        topic.accept(b"version/T/abc", b'{"columns": ' + b"{" * 5000 + b"}")
        topic.accept(real.fingerprint_hex.encode(), real.schema_json.encode())
    assert real.fingerprint in topic.texts
    assert "a table-version record was ignored" in caplog.text


def test_schema_topic_memory_is_bounded_by_bytes_not_only_by_count(caplog: pytest.LogCaptureFixture) -> None:
    """1 MB of free ``doc`` text (outside the fingerprint) per schema kept 301 MB for 300 of
    them; a JSON table version had no column cap (16.6 MB on the topic, 538 MB of driver heap)."""
    key = {"name": "Id", "type": {"code": "INT64"}, "is_primary_key": True, "ordinal_position": 1}
    topic = SchemaTopic({}, "P", max_bytes=200_000)
    with caplog.at_level(logging.WARNING, logger="spanner_cdc"):
        for n in range(300):
            schema = TableSchema.from_column_types(f"T{n}", [key]).event_schema
            schema["doc"] = "x" * 1_000_000
            writer = WriterSchema.from_schema(schema)
            topic.accept(writer.fingerprint_hex.encode(), json.dumps(schema).encode())
    kept = sum(len(text) for text in topic.texts.values())
    assert kept <= 200_000 and 10 < len(topic.texts) < 300
    assert all('"doc"' not in text or "x" * 100 not in text for text in topic.texts.values())
    assert "bytes of writer schemas" in caplog.text

    topic = SchemaTopic({}, "P")
    wide = {"table": "W", "columns": [[f"c{i}", {"code": "INT64"}, i == 0, i + 1] for i in range(2_000)]}
    huge = json.dumps({"table": "H", "columns": [["c", {"code": "STRING"}, True, 1]], "pad": "x" * 2_000_000})
    with caplog.at_level(logging.WARNING, logger="spanner_cdc"):
        topic.accept(b"version/abc/W", json.dumps(wide).encode())
        topic.accept(b"version/abc/H", huge.encode())
    assert topic.versions == {}
    assert "2,000 columns" in caplog.text
    assert "a table-version record of" in caplog.text
