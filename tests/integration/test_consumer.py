"""The consumer against real Spark (local[2]), the embedded broker and PostgreSQL/DuckDB.

Events are built and published exactly as the producer does (tests/support/synthetic.py), so
each test can set up the situation it is about: duplicates, out-of-order changes, partial
updates, undecodable messages, a column added mid-stream.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from spanner_cdc.consumer.config import ConsumerConfig
from spanner_cdc.consumer.errors import ConsumerError
from spanner_cdc.consumer.readers import changelog_rows, quarantine_rows, replica_rows
from spanner_cdc.consumer.sinks.replica.backends import open_backend
from spanner_cdc.consumer.streams.api import StreamReplica
from spanner_cdc.schemas.events import Event
from spanner_cdc.schemas.wire import WriterSchema, encode
from spanner_cdc.stack import EmbeddedStack
from testkit.consumer_run import SQL_REPLICAS, ConfigFactory, committed_batches, on_disk, run_consumer
from testkit.synthetic import ChangeFactory, publish
from tests.support.object_store import ObjectStore, reach_from

pytestmark = [pytest.mark.integration, pytest.mark.spark]
#: The SQL replicas and the Delta replica: the same rules, the same rows.
WITH_DELTA = pytest.mark.parametrize("configure", [*SQL_REPLICAS, "delta"], indirect=True)


def test_duplicates_in_one_batch_and_across_batches_are_delivered_once(
    spark: Any, stack: EmbeddedStack, configure: ConfigFactory
) -> None:
    deliver_duplicates_in_and_across_batches(spark, configure())


@pytest.mark.parametrize("configure", ["duckdb"], indirect=True)
def test_duplicates_are_delivered_once_with_every_location_on_an_object_store(
    spark: Any, stack: EmbeddedStack, configure: ConfigFactory, object_store: ObjectStore, tmp_path: Path
) -> None:
    """The same on ``s3a://``: the job's session reaches the bucket (as ``core-site.xml`` or
    ``spark-submit --conf spark.hadoop.…`` would make it), and the consumer's own files follow
    the session's settings (a Delta replica on an object store: test_consumer_restart.py)."""
    bucket = object_store.bucket()
    reach_from(spark, object_store.spark_conf(bucket))
    config = configure(output_dir=f"s3a://{bucket}/out", local_dir=tmp_path / "local")
    deliver_duplicates_in_and_across_batches(
        spark, replace(config, spark_conf=object_store.spark_conf(bucket))
    )
    keys = object_store.keys(bucket)
    assert any(k.startswith("out/checkpoint/spark/commits/") for k in keys), keys[:20]
    assert any(k.startswith("out/changelog/object=Accounts/commit_date=") for k in keys), keys[:20]


def deliver_duplicates_in_and_across_batches(spark: Any, config: ConsumerConfig) -> None:
    """Each change once in the changelog, the replica at the newest: a batch with every event
    twice, then a second run with some of them re-sent (a producer restart's)."""
    factory = ChangeFactory()
    first = factory.events(
        factory.record("INSERT", {"Id": "a"}, {"Balance": "1", "Note": "x"}),
        factory.record("INSERT", {"Id": "b"}, {"Balance": "2", "Note": "y"}),
        factory.record("UPDATE", {"Id": "a"}, {"Balance": "3", "Note": "x"}),
    )
    publish(config.kafka_bootstrap, config.topic_prefix, first + first)  # duplicates within one batch
    run_consumer(spark, config)
    publish(config.kafka_bootstrap, config.topic_prefix, first[1:])  # re-sent after a "producer restart"
    run_consumer(spark, config)

    uuids = [row[0] for row in changelog_rows(config, "Accounts", '"envelope$uuid"')]
    assert uuids == [e.value["uuid"] for e in first]
    assert replica_rows(config, "Accounts", '"Id", "Balance", "Note"') == [("a", 3, "x"), ("b", 2, "y")]


@pytest.mark.parametrize("configure", SQL_REPLICAS, indirect=True)
def test_out_of_order_events_never_overwrite_newer_state(
    spark: Any, stack: EmbeddedStack, configure: ConfigFactory
) -> None:
    config = configure()
    factory = ChangeFactory()
    base = 1_760_000_000_000_000
    old_update = factory.record(
        "UPDATE", {"Id": "a"}, {"Balance": "10", "Note": "old"}, commit_micros=base + 1
    )
    new_update = factory.record(
        "UPDATE", {"Id": "a"}, {"Balance": "20", "Note": "new"}, commit_micros=base + 2
    )
    old_insert = factory.record(
        "INSERT", {"Id": "d"}, {"Balance": "1", "Note": "stale"}, commit_micros=base + 3
    )
    delete = factory.record(
        "DELETE", {"Id": "d"}, {}, {"Balance": "1", "Note": "stale"}, commit_micros=base + 4
    )
    publish(config.kafka_bootstrap, config.topic_prefix, factory.events(new_update, delete))
    run_consumer(spark, config)
    publish(config.kafka_bootstrap, config.topic_prefix, factory.events(old_update, old_insert))
    run_consumer(spark, config)

    # The late update is older than the stored row; the late insert is older than the delete.
    assert replica_rows(config, "Accounts", '"Id", "Balance", "Note"') == [("a", 20, "new")]
    assert len(changelog_rows(config, "Accounts", '"envelope$uuid"')) == 4, (
        "late changes are recorded, not dropped"
    )


@WITH_DELTA
def test_partial_updates_keep_other_columns_deletes_remove_and_reinsert_works(
    spark: Any, stack: EmbeddedStack, configure: ConfigFactory
) -> None:
    config = configure()
    factory = ChangeFactory(capture="NEW_VALUES")
    publish(
        config.kafka_bootstrap,
        config.topic_prefix,
        factory.events(
            factory.record("INSERT", {"Id": "a"}, {"Balance": "1", "Note": "keep me"}),
            factory.record("INSERT", {"Id": "b"}, {"Balance": "5", "Note": "gone"}),
            factory.record("UPDATE", {"Id": "a"}, {"Balance": "2"}),  # same batch as the insert
            factory.record("DELETE", {"Id": "b"}, {}),
            factory.record("INSERT", {"Id": "c"}, {"Balance": "7", "Note": "first life"}),
            factory.record("DELETE", {"Id": "c"}, {}),
            factory.record("INSERT", {"Id": "c"}, {"Balance": "8"}),  # re-insert in the same batch
        ),
    )
    run_consumer(spark, config)
    assert replica_rows(config, "Accounts", '"Id", "Balance", "Note"') == [
        ("a", 2, "keep me"),
        ("c", 8, None),
    ]

    publish(
        config.kafka_bootstrap,
        config.topic_prefix,
        factory.events(
            factory.record("UPDATE", {"Id": "a"}, {"Note": "changed"}),  # a later batch
            factory.record("INSERT", {"Id": "b"}, {"Balance": "6", "Note": "back"}),
        ),
    )
    run_consumer(spark, config)
    assert replica_rows(config, "Accounts", '"Id", "Balance", "Note"') == [
        ("a", 2, "changed"),
        ("b", 6, "back"),
        ("c", 8, None),
    ]
    types = changelog_rows(config, "Accounts", '"Id", "change$type"')
    assert types[:4] == [("a", "INSERT"), ("b", "INSERT"), ("a", "UPDATE"), ("b", "DELETE")]


def test_undecodable_messages_are_quarantined_while_good_events_flow(
    spark: Any, stack: EmbeddedStack, configure: ConfigFactory
) -> None:
    config = configure()
    factory = ChangeFactory()
    events = factory.events(
        factory.record("INSERT", {"Id": "a"}, {"Balance": "1", "Note": "x"}),
        factory.record("INSERT", {"Id": "b"}, {"Balance": "2", "Note": "y"}),
    )
    writer = WriterSchema.from_schema(events[0].table.event_schema)
    good_bytes = encode(writer, events[0].value)
    topic = f"{config.topic_prefix}.Accounts"
    bad = [
        (topic, b"not avro at all"),
        (topic, b"\xc3\x01" + (writer.fingerprint ^ 1).to_bytes(8, "little") + good_bytes[10:]),
        (topic, good_bytes[: len(good_bytes) // 2]),
    ]
    publish(config.kafka_bootstrap, config.topic_prefix, events, raw=bad)
    run_consumer(spark, config)

    assert replica_rows(config, "Accounts", '"Id"') == [("a",), ("b",)]
    quarantined = sorted(quarantine_rows(config), key=lambda row: str(row[1]))
    assert [row[1] for row in quarantined] == ["bad-magic", "truncated", "unknown-fingerprint"]
    assert {bytes(row[2]) for row in quarantined} == {value for _, value in bad}
    # Written by the tasks that read them (the driver writes only watermarks it refutes), and
    # nothing left staged.
    files = sorted(
        path.relative_to(on_disk(config).quarantine) for path in on_disk(config).quarantine.rglob("*.parquet")
    )
    assert files and all("-part-" in path.name and path.parent == Path(".") for path in files), files


def test_fail_on_bad_message_stops_with_the_reason(
    spark: Any, stack: EmbeddedStack, configure: ConfigFactory
) -> None:
    config = configure(on_bad_message="fail")
    publish(
        config.kafka_bootstrap,
        config.topic_prefix,
        [],
        raw=[(f"{config.topic_prefix}.Accounts", b"plain text, not an event")],
    )
    with pytest.raises(ConsumerError, match="bad-magic"):
        run_consumer(spark, config)
    assert not on_disk(config).quarantine.exists()


@pytest.mark.parametrize("configure", ["duckdb"], indirect=True)
def test_a_table_topic_created_again_stops_the_consumer_until_told_to_go_on(
    spark: Any, stack: EmbeddedStack, configure: ConfigFactory
) -> None:
    """The table's topic is deleted and created again between two runs, with fewer records
    than were read: the consumer stops in one line naming the loss and writes nothing. With
    ``--fail-on-data-loss false`` it goes on as Spark's source does — from the new topic's end,
    so what the new topic held below the old position is skipped — and what comes after lands."""
    config = configure()
    factory = ChangeFactory()
    first = [factory.record("INSERT", {"Id": f"k{i}"}, {"Balance": str(i), "Note": "old"}) for i in range(30)]
    publish(config.kafka_bootstrap, config.topic_prefix, factory.events(*first))
    run_consumer(spark, config)
    topic = config.topics.event("Accounts")
    admin = AdminClient({"bootstrap.servers": config.kafka_bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    skipped = factory.events(factory.record("INSERT", {"Id": "new"}, {"Balance": "99", "Note": "new"}))
    publish(config.kafka_bootstrap, config.topic_prefix, skipped)

    with pytest.raises(ConsumerError, match="Some data may have been lost"):
        run_consumer(spark, config)
    old = [(f"k{i}", i) for i in range(30)]
    assert sorted(replica_rows(config, "Accounts", '"Id", "Balance"')) == sorted(old)

    run_consumer(spark, replace(config, fail_on_data_loss=False))
    later = factory.events(factory.record("INSERT", {"Id": "later"}, {"Balance": "7", "Note": "new"}))
    publish(config.kafka_bootstrap, config.topic_prefix, later)
    run_consumer(spark, replace(config, fail_on_data_loss=False))
    rows = replica_rows(config, "Accounts", '"Id", "Balance"')
    assert sorted(rows) == sorted([*old, ("later", 7)])
    uuids = [row[0] for row in changelog_rows(config, "Accounts", '"envelope$uuid"')]
    assert uuids[-1] == later[0].value["uuid"] and len(uuids) == 31


def test_a_consumer_started_at_latest_reads_what_is_written_after_it_started(
    spark: Any, stack: EmbeddedStack, configure: ConfigFactory
) -> None:
    """``--starting-offsets latest``: the first run's batch is empty and ends where Kafka ended
    (kafka_source.latestOffset pins it); the next run reads from there, every event written
    since and none before."""
    config = configure(starting_offsets="latest")
    factory = ChangeFactory()
    before = factory.events(
        *(factory.record("INSERT", {"Id": f"old{i}"}, {"Balance": "1"}) for i in range(3))
    )
    publish(config.kafka_bootstrap, config.topic_prefix, before)
    run_consumer(spark, config)
    assert committed_batches(config) == 1, "one batch, empty, ending at Kafka's end"

    after = factory.events(*(factory.record("INSERT", {"Id": f"new{i}"}, {"Balance": "2"}) for i in range(2)))
    publish(config.kafka_bootstrap, config.topic_prefix, after)
    run_consumer(spark, config)
    assert replica_rows(config, "Accounts", '"Id"') == [("new0",), ("new1",)]
    assert [row[0] for row in changelog_rows(config, "Accounts", '"Id"')] == ["new0", "new1"]


def consumed_in_two_runs(spark: Any, config: ConsumerConfig, first: list[Event], second: list[Event]) -> None:
    """``first`` published and consumed, then ``second``: a table's schema changes between them."""
    for events in (first, second):
        publish(config.kafka_bootstrap, config.topic_prefix, events)
        run_consumer(spark, config)


@WITH_DELTA
def test_a_column_added_mid_stream_reaches_both_sinks(
    spark: Any, stack: EmbeddedStack, configure: ConfigFactory
) -> None:
    config = configure()
    before = ChangeFactory()
    after = ChangeFactory(columns=(*before.columns, ("Currency", "STRING", False)))
    consumed_in_two_runs(
        spark,
        config,
        before.events(before.record("INSERT", {"Id": "a"}, {"Balance": "1", "Note": "x"})),
        after.events(
            after.record("INSERT", {"Id": "b"}, {"Balance": "2", "Note": "y", "Currency": "EUR"}),
            after.record("UPDATE", {"Id": "a"}, {"Balance": "3", "Note": "x", "Currency": "CHF"}),
        ),
    )
    assert replica_rows(config, "Accounts", '"Id", "Balance", "Currency"') == [
        ("a", 3, "CHF"),
        ("b", 2, "EUR"),
    ]
    assert changelog_rows(config, "Accounts", '"Id", "Currency"') == [("a", None), ("b", "EUR"), ("a", "CHF")]


def test_a_column_spanner_changed_from_string_to_bytes_reaches_both_sinks(
    spark: Any, stack: EmbeddedStack, configure: ConfigFactory
) -> None:
    """Spanner's ``ALTER COLUMN Note BYTES(MAX)`` mid-stream; the second run's batch holds events
    of both types and a value that is not UTF-8. Each changelog file has its batch's type (read
    together, as bytes); the replica's column becomes BYTES, the older texts as their UTF-8."""
    config = configure()
    before = ChangeFactory()
    after = ChangeFactory(columns=[(n, "BYTES" if n == "Note" else t, k) for n, t, k in before.columns])
    consumed_in_two_runs(
        spark,
        config,
        before.events(before.record("INSERT", {"Id": "a"}, {"Balance": "1", "Note": "x"})),
        [
            *before.events(before.record("INSERT", {"Id": "c"}, {"Balance": "3", "Note": "é"})),
            *after.events(
                after.record("INSERT", {"Id": "b"}, {"Balance": "2", "Note": "/w=="}),  # base64 of ff
                after.record("UPDATE", {"Id": "a"}, {"Note": "aGk="}),  # "hi"
            ),
        ],
    )

    assert replica_rows(config, "Accounts", '"Id", "Note"') == [
        ("a", b"hi"),
        ("b", b"\xff"),
        ("c", "é".encode()),
    ]
    assert changelog_rows(config, "Accounts", '"Id", "Note"') == [
        ("a", b"x"),
        ("c", "é".encode()),
        ("b", b"\xff"),
        ("a", b"hi"),
    ]


def test_a_column_that_changes_to_a_type_it_cannot_become_in_one_batch_stops_that_table(
    spark: Any, stack: EmbeddedStack, configure: ConfigFactory
) -> None:
    """INT64 to STRING in one batch (no change Spanner makes in place: a table dropped and created
    again under its key): the changelog holds both events (each type in files of its own), the
    replica applies the table's changes up to the change and stops the table there, naming
    column, table and both types, and another table in the same batch goes on. Before, the
    query failed at every start."""
    config = configure()
    before = ChangeFactory()
    after = ChangeFactory(columns=[(n, "STRING" if n == "Balance" else t, k) for n, t, k in before.columns])
    audit = ChangeFactory(table="Audit", columns=[("Id", "STRING", True), ("Note", "STRING", False)])
    events = [
        *before.events(before.record("INSERT", {"Id": "a"}, {"Balance": "1"})),
        *after.events(after.record("INSERT", {"Id": "b"}, {"Balance": "two"})),
        *audit.events(audit.record("INSERT", {"Id": "x"}, {"Note": "kept"})),
    ]
    publish(config.kafka_bootstrap, config.topic_prefix, events)
    run_consumer(spark, config)

    assert changelog_rows(config, "Accounts", '"Id"') == [("a",), ("b",)]
    assert replica_rows(config, "Accounts", '"Id", "Balance"') == [("a", 1)]
    assert replica_rows(config, "Audit", '"Id", "Note"') == [("x", "kept")]
    stopped = _stopped(config)
    assert list(stopped) == ["Accounts"]
    assert (
        '1 change(s) not applied: column Balance is "string" in the events of Accounts' in stopped["Accounts"]
    )


@pytest.mark.parametrize("configure", ["duckdb"], indirect=True)
def test_a_later_batch_that_brings_a_column_another_type_stops_that_table(
    spark: Any, stack: EmbeddedStack, configure: ConfigFactory
) -> None:
    """INT64, then FLOAT64 in a later run (a table dropped and created again under its key): the
    replica's BIGINT column cannot hold the new values (it stored 7.25 as 7 before), and no batch
    could ever merge them, so the batch stops the table and commits: the replica keeps what the
    first run wrote, the changelog has the new event, and the table's later changes are counted,
    not applied."""
    config = configure()
    before = ChangeFactory()
    after = ChangeFactory(columns=[(n, "FLOAT64" if n == "Balance" else t, k) for n, t, k in before.columns])
    for events in (
        before.events(before.record("INSERT", {"Id": "a"}, {"Balance": "1"})),
        after.events(after.record("UPDATE", {"Id": "a"}, {"Balance": 7.25})),
        after.events(after.record("INSERT", {"Id": "b"}, {"Balance": 0.5})),
    ):
        publish(config.kafka_bootstrap, config.topic_prefix, events)
        run_consumer(spark, config)

    assert replica_rows(config, "Accounts", '"Id", "Balance"') == [("a", 1)]
    assert changelog_rows(config, "Accounts", '"Id", "Balance"') == [("a", 1), ("a", 7.25), ("b", 0.5)]
    stopped = _stopped(config)["Accounts"]
    assert stopped.startswith("since ") and '2 change(s) not applied: column Balance is "double"' in stopped


def _stopped(config: ConsumerConfig) -> dict[str, str]:
    """``replica status``'s stopped tables: Spanner name → why, since when, how many changes."""
    replica = StreamReplica(open_backend(config.replica, config.duckdb_path, config.postgres_dsn))
    try:
        return {t.source: t.stopped for t in replica.status().tables if t.stopped is not None}
    finally:
        replica.close()


def test_uuid_columns_reach_both_sinks(spark: Any, stack: EmbeddedStack, configure: ConfigFactory) -> None:
    """Spanner's UUID type (Avro string with logicalType uuid): a UUID key and a UUID value
    column, updated and deleted, land as text in the changelog and as UUID in the replica."""
    config = configure()
    first, second, third = (
        "0b9e3f52-6c1d-4a8e-9f21-7d2c5e4b1a90",
        "7f000001-0000-4000-8000-000000000001",
        "ffffffff-ffff-4fff-bfff-ffffffffffff",
    )
    table = ChangeFactory(table="Devices", columns=(("Id", "UUID", True), ("Owner", "UUID", False)))
    publish(
        config.kafka_bootstrap,
        config.topic_prefix,
        table.events(
            table.record("INSERT", {"Id": first}, {"Owner": second}),
            table.record("INSERT", {"Id": second}, {"Owner": None}),
            table.record("UPDATE", {"Id": first}, {"Owner": third.upper()}),
            table.record("DELETE", {"Id": second}, {}, {"Owner": None}),
        ),
    )
    run_consumer(spark, config)
    assert not on_disk(config).quarantine.exists()
    assert replica_rows(config, "Devices", 'CAST("Id" AS VARCHAR), CAST("Owner" AS VARCHAR)') == [
        (first, third)
    ]
    assert changelog_rows(config, "Devices", '"Id", "Owner"') == [
        (first, second),
        (second, None),
        (first, third),
        (second, None),
    ]
    column_type = replica_rows(
        config, "Devices", 'pg_typeof("Id")::text' if config.replica == "postgres" else 'typeof("Id")'
    )
    assert column_type == [("uuid",)] if config.replica == "postgres" else [("UUID",)]
