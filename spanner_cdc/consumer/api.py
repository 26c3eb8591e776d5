"""The consumer inside a PySpark job of your own: spark-submit, Databricks, Dataproc, EMR.

``spanner-cdc consume`` owns its Spark session. A job that owns its own session reads the
project's topics and applies them with the same rules — dedupe by uuid, order by sort_keys,
every sink exactly once, whole transactions in the replica — through :class:`ChangeConsumer`::

    from pyspark.sql import SparkSession
    from spanner_cdc.consumer.api import ChangeConsumer

    spark = SparkSession.builder.appName("bank-cdc").getOrCreate()
    with ChangeConsumer.open(kafka_bootstrap="kafka:9092", topic_prefix="bank",
                             output_dir="/shared/cdc") as cdc:
        query = (cdc.read_stream(spark).writeStream
                 .foreachBatch(cdc.apply)
                 .option("checkpointLocation", cdc.checkpoint_location)
                 .trigger(availableNow=True).start())
        query.awaitTermination()

The job needs Spark's Kafka connector on its classpath (``--packages`` or ``--jars``) and this
package on the executors (docs/deployment.md says how).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from spanner_cdc.common.config import ConfigError, resolve
from spanner_cdc.consumer.config import CONSUME_OPTIONS, ConsumerConfig
from spanner_cdc.consumer.locations import hadoop_settings
from spanner_cdc.consumer.main import ConsumerJob
from spanner_cdc.consumer.query_rates import QueryRates
from spanner_cdc.consumer.spark.session import session_hadoop_settings
from spanner_cdc.errors import SpannerCdcError

__all__ = ["ChangeConsumer", "ConfigError", "SpannerCdcError"]


def consumer_config(options: Mapping[str, Any]) -> ConsumerConfig:
    """``consume``'s configuration from keyword options named as its command-line options
    (``kafka_bootstrap`` for ``--kafka-bootstrap``), then its environment variables and
    ``SPANNER_CDC_CONFIG`` file, then its defaults — parsed and checked as the command's are."""
    known = {option.dest: option for option in CONSUME_OPTIONS}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(f"unknown consumer option(s): {', '.join(unknown)}")
    given = {dest: _as_given(known[dest].repeated, value) for dest, value in options.items()}
    namespace = argparse.Namespace(config=None, **{dest: given.get(dest) for dest in known})
    return ConsumerConfig.from_options(resolve(namespace, CONSUME_OPTIONS, "consume"))


def _as_given(repeated: bool, value: Any) -> Any:
    """A keyword value as the command line would hold it: a mapping of settings is ``KEY=VALUE``
    entries, a repeated option a list, anything else its text."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return [f"{key}={setting}" for key, setting in value.items()]
    if repeated and isinstance(value, list | tuple):
        return [str(item) for item in value]
    return str(value).lower() if isinstance(value, bool) else str(value)


def active_session_hadoop_settings(config: ConsumerConfig) -> dict[str, str] | None:
    """The Hadoop settings the job's query will run with: its active session's (what
    ``spark-submit --conf spark.hadoop.…`` and ``core-site.xml`` set), ``spark_conf``'s
    ``spark.hadoop.*`` over them; None without an active session (``spark_conf``'s alone)."""
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is None:
        return None
    return {**session_hadoop_settings(session), **hadoop_settings(config.spark_conf)}


class ChangeConsumer:
    """The project's topics read by the job's own streaming query, applied to the sinks.

    Give :meth:`apply` to ``foreachBatch`` unchanged — the batch as Spark's Kafka source hands it
    — and use :attr:`checkpoint_location`: exactly-once rests on Spark's offsets and commits
    being the ones the sinks record. One query per ``ChangeConsumer``; :meth:`close` (or the
    ``with`` block) releases the replica's database, the dedupe memory and the metrics server.
    """

    def __init__(self, job: ConsumerJob) -> None:
        self._job = job

    @classmethod
    def open(cls, **options: Any) -> ChangeConsumer:
        """Check Kafka (and the replica's database) answer and open the sinks. ``options`` are
        ``spanner-cdc consume``'s, by their Python names (docs/reference.md); ``metrics_port``
        serves the metrics and the status page from the driver. Raises :class:`ConfigError` for
        a bad option, :class:`SpannerCdcError` for a service that does not answer."""
        config = consumer_config(options)
        job = ConsumerJob.open(config, hadoop=active_session_hadoop_settings(config))
        job.processor.metrics.serve(config.metrics_port, config.metrics_host)
        return cls(job)

    @property
    def checkpoint_location(self) -> str:
        """The query's ``checkpointLocation``: Spark's own checkpoint inside ``checkpoint_dir``."""
        return self._job.locations.spark_checkpoint.uri

    def read_stream(self, spark: Any) -> Any:
        """A streaming DataFrame of the prefix's event topics: Spark's Kafka source with the
        options ``consume`` gives it (committed records only, ``max_events_per_batch``,
        ``source_option`` last). The query's rates join the consumer's metrics."""
        spark.streams.addListener(QueryRates(self._job.processor.metrics))
        return self._job.read_stream(spark)

    def apply(self, batch: Any, batch_id: int) -> None:
        """One micro-batch into every sink (the ``foreachBatch`` function): a replay of a batch
        already applied changes nothing."""
        self._job.run_batch(batch, batch_id)

    def close(self) -> None:
        self._job.close()

    def __enter__(self) -> ChangeConsumer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()
