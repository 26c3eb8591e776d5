"""Consumer benchmarks (issue 4): events/s into each sink beside a raw read, in the same run.

The same topic (a random insert/update/delete history over many keys, with a tenth re-sent as
duplicates) is consumed by separate Trigger.AvailableNow queries on one local[2] session:

- raw: the Kafka source into ``foreachBatch`` that only collects the rows as Arrow (no decode),
  the ceiling for anything built on this source;
- changelog: decode, dedupe, order, Parquet;
- replica DuckDB / replica PostgreSQL: decode, dedupe, order, merge — each with whole
  transactions (the default: hold what the watermarks have not passed) and without.

Events are published in chunks of ``WATERMARK_EVERY`` with a watermark after each, as a
producer writing that many events per watermark interval would.

Each figure is wall time from query start to its end, so it includes Spark's per-query start.
"""

from __future__ import annotations

import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.producer import Figure
from spanner_cdc.consumer.config import ConsumerConfig
from spanner_cdc.consumer.kafka_source import SOURCE_NAME
from spanner_cdc.consumer.main import ConsumerJob, drain
from spanner_cdc.consumer.spark_session import spark_session
from testkit.consumer_run import consumer_config, fresh_postgres_database, unique_prefix
from testkit.synthetic import ChangeFactory, publish, random_history

WATERMARK_EVERY = 5_000


def raw_read(spark: Any, config: ConsumerConfig, checkpoint: Path) -> int:
    rows = 0

    def collect(batch: Any, _batch_id: int) -> None:
        nonlocal rows
        rows += batch.toArrow().num_rows

    query = (
        spark.readStream.format(SOURCE_NAME)
        .option("kafka.bootstrap.servers", config.kafka_bootstrap)
        .option("subscribePattern", config.topics.event_pattern)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return rows


def consumer_figures(bootstrap: str, postgres_dsn: str, changes: int) -> list[Figure]:
    prefix = unique_prefix("Bench")
    events = random_history(ChangeFactory(), changes, keys=max(10, changes // 5))
    published = events + random.Random(1).sample(events, changes // 10)
    for start in range(0, len(published), WATERMARK_EVERY):
        publish(bootstrap, prefix, published[start : start + WATERMARK_EVERY])
    work = Path(tempfile.mkdtemp(prefix="spanner-cdc-bench-"))
    base = consumer_config(bootstrap, prefix, work / "unused")
    spark = spark_session(
        "local[2]", "spanner-cdc-bench", log_dir=Path(tempfile.mkdtemp(prefix="spark-logs-"))
    )
    figures = []
    try:
        raw_read(spark, base, work / "warm-up")  # JVM and Python workers warm for every figure
        started = time.perf_counter()
        rows = raw_read(spark, base, work / "raw")
        figures.append(
            Figure("raw Spark read (source → Arrow, no decode)", rows, time.perf_counter() - started)
        )
        runs: list[tuple[str, dict[str, Any]]] = [
            ("changelog (decode, dedupe, order, Parquet)", {"sinks": ("changelog",)})
        ]
        for database in ("DuckDB", "PostgreSQL"):
            for grouping, whole in (("whole transactions", True), ("batch as it comes", False)):
                options: dict[str, Any] = {"sinks": ("replica",), "whole_transactions": whole}
                if database == "PostgreSQL":
                    options |= {"replica": "postgres", "postgres_dsn": fresh_postgres_database(postgres_dsn)}
                runs.append((f"replica {database}, {grouping} (decode, dedupe, order, merge)", options))
        for name, overrides in runs:
            directory = name.split(" (")[0].replace(" ", "-").replace(",", "")
            config = consumer_config(bootstrap, prefix, work / directory, **overrides)
            job = ConsumerJob.open(config)
            try:
                started = time.perf_counter()
                drain(job, spark, threading.Event())
                figures.append(Figure(name, len(published), time.perf_counter() - started))
            finally:
                job.close()
    finally:
        spark.stop()
    return figures
