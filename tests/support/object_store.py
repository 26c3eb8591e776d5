"""An S3-compatible server for the tests: moto's server mode on 127.0.0.1, in a process of its
own, reached by Spark's ``s3a`` connector and by pyarrow exactly as a bucket on S3 would be."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable, QueryBuilder

from spanner_cdc.stack.process import free_port, stop_process_group
from tests.support.waiting import wait_for

ACCESS_KEY = "spanner-cdc-tests"
SECRET_KEY = "spanner-cdc-tests-secret"
REGION = "us-east-1"


@dataclass(frozen=True)
class ObjectStore:
    endpoint: str

    def filesystem(self) -> pafs.S3FileSystem:
        return pafs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region=REGION,
            scheme="http",
            endpoint_override=self.endpoint.removeprefix("http://"),
            allow_bucket_creation=True,
        )

    def answers(self) -> bool:
        try:
            self.filesystem().get_file_info(pafs.FileSelector("/"))
        except OSError:
            return False
        return True

    def bucket(self) -> str:
        """A new, empty bucket."""
        name = f"cdc-{uuid.uuid4().hex[:12]}"
        self.filesystem().create_dir(name)
        return name

    def spark_conf(self, bucket: str) -> dict[str, str]:
        """The settings that reach ``bucket`` — Hadoop's ``fs.s3a.*`` for that bucket alone, as
        ``--spark-conf`` (``spark.hadoop.…``) takes them."""
        settings = {
            "endpoint": self.endpoint,
            "endpoint.region": REGION,
            "path.style.access": "true",
            "access.key": ACCESS_KEY,
            "secret.key": SECRET_KEY,
        }
        return {f"spark.hadoop.fs.s3a.bucket.{bucket}.{name}": value for name, value in settings.items()}

    def delta_rows(self, uri: str, columns: str) -> list[tuple[Any, ...]]:
        """``columns`` (SQL, names in double quotes) of the Delta table at ``uri`` (``s3a://``) on
        this server, ordered by the first. Read by delta-rs (the ``deltalake`` package), a reader
        of the Delta protocol other than Spark's that honours deletion vectors and column
        mapping: no Spark session needed, and the tables shown readable beyond Spark."""
        options = {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
        }
        query = QueryBuilder().register("t", DeltaTable(uri, storage_options=options))
        result = pa.table(query.execute(f"SELECT {columns} FROM t ORDER BY 1").read_all())
        return list(zip(*(column.to_pylist() for column in result.columns), strict=True))

    def keys(self, bucket: str) -> list[str]:
        """Every object of ``bucket``, by its key."""
        listed = self.filesystem().get_file_info(pafs.FileSelector(bucket, recursive=True))
        return sorted(
            info.path.removeprefix(f"{bucket}/") for info in listed if info.type == pafs.FileType.File
        )


def reach_from(spark: Any, spark_conf: dict[str, str]) -> None:
    """``spark_conf``'s Hadoop settings (``spark.hadoop.*``) into a running session's Hadoop
    configuration: what ``core-site.xml`` gives a cluster's sessions."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in spark_conf.items():
        hadoop.set(key.removeprefix("spark.hadoop."), value)


@contextmanager
def object_store_server() -> Iterator[ObjectStore]:
    """moto's S3 server on a free port of 127.0.0.1, stopped when the block ends."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    store = ObjectStore(f"http://127.0.0.1:{port}")
    try:
        wait_for(lambda: process.poll() is not None or store.answers(), 60, "the S3 server to answer")
        assert process.poll() is None, "the S3 server exited"
        yield store
    finally:
        stop_process_group(process.pid)
