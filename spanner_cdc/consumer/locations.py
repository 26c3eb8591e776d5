"""Where the consumer keeps its files — a local path, or an ``s3a://`` location on an object
store — and how it reads and writes them there, on the driver and in the tasks alike.

Spark writes its own checkpoint through Hadoop's file systems (``s3a``: hadoop-aws, among the
jars ``make`` resolves). Everything else — changelog, quarantine, staging, the dedupe memory, the
schema cache — goes through pyarrow's file systems, made from the same ``fs.s3a.*`` settings
Spark's Hadoop configuration holds, so both reach the same bucket with the same credentials
(settings not given fall back to the AWS SDK's default credential chain in both).

A file is written *whole or not at all* on every store: under a temporary name beside it (a
name starting with ``.``, which Spark's, pyarrow's and DuckDB's readers skip), then moved to its
name. On a disk the move is a rename; an object store has no rename, and there it is a copy —
one request, after which the object appears complete — and a delete of the temporary object.
A crash between the two leaves a hidden temporary object and never a partial file.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import posixpath
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from spanner_cdc.consumer.config import LOCAL_SCHEME, OBJECT_STORE_SCHEME, ConsumerConfig, uri_scheme

#: Hadoop's S3A settings (``fs.s3a.<name>``, or ``fs.s3a.bucket.<bucket>.<name>`` for one bucket)
#: and the pyarrow ``S3FileSystem`` argument each becomes.
_S3A_CREDENTIALS = {"access.key": "access_key", "secret.key": "secret_key", "session.token": "session_token"}
_S3A_PREFIX = "fs.s3a."
_SPARK_HADOOP_PREFIX = "spark.hadoop."
_ANONYMOUS_PROVIDER = "AnonymousAWSCredentialsProvider"


def hadoop_settings(spark_conf: Mapping[str, str]) -> dict[str, str]:
    """The Hadoop settings among Spark settings (``spark.hadoop.<name>`` → ``<name>``): what
    Spark puts in its Hadoop configuration."""
    return {
        key.removeprefix(_SPARK_HADOOP_PREFIX): value
        for key, value in spark_conf.items()
        if key.startswith(_SPARK_HADOOP_PREFIX)
    }


def s3_filesystem(bucket: str, hadoop: Mapping[str, str]) -> pafs.S3FileSystem:
    """pyarrow's S3 file system for ``bucket``, from Hadoop's S3A settings: endpoint (a scheme
    in it, or ``connection.ssl.enabled``, decides http or https), region
    (``endpoint.region``), ``path.style.access``, static credentials and the anonymous provider.
    A bucket's own ``fs.s3a.bucket.<bucket>.*`` settings win over the general ones, as in Hadoop."""
    general = {k.removeprefix(_S3A_PREFIX): v for k, v in hadoop.items() if k.startswith(_S3A_PREFIX)}
    own_prefix = f"bucket.{bucket}."
    settings = {
        **{k: v for k, v in general.items() if not k.startswith("bucket.")},
        **{k.removeprefix(own_prefix): v for k, v in general.items() if k.startswith(own_prefix)},
    }
    arguments: dict[str, Any] = {
        argument: settings[name] for name, argument in _S3A_CREDENTIALS.items() if settings.get(name)
    }
    endpoint = settings.get("endpoint", "").strip()
    if endpoint:
        parsed = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"//{endpoint}")
        secure = settings.get("connection.ssl.enabled", "true").strip().lower() != "false"
        arguments["scheme"] = parsed.scheme or ("https" if secure else "http")
        arguments["endpoint_override"] = parsed.netloc
        path_style = settings.get("path.style.access", "false").strip().lower() == "true"
        arguments["force_virtual_addressing"] = not path_style
    region = settings.get("endpoint.region") or settings.get("region")
    if region:
        arguments["region"] = region.strip()
    providers = [p.strip() for p in settings.get("aws.credentials.provider", "").split(",") if p.strip()]
    if len(providers) == 1 and providers[0].endswith(_ANONYMOUS_PROVIDER):
        arguments["anonymous"] = True
    return pafs.S3FileSystem(**arguments)


@dataclass(frozen=True)
class Location:
    """A file or directory: ``path`` on pyarrow's ``filesystem``; ``uri`` is what Spark and
    people are told. Values are picklable: tasks get them in their closures."""

    filesystem: pafs.FileSystem
    path: str
    uri: str

    @classmethod
    def parse(cls, text: str, hadoop: Mapping[str, str]) -> Location:
        """A location as ``--output-dir`` takes it (``config.location``: a path, ``file://`` or
        ``s3a://``), its file system made from the Hadoop settings ``hadoop``."""
        scheme = uri_scheme(text)
        if scheme == OBJECT_STORE_SCHEME:
            parsed = urllib.parse.urlsplit(text)
            key = parsed.path.strip("/")
            path = posixpath.join(parsed.netloc, key) if key else parsed.netloc
            return cls(s3_filesystem(parsed.netloc, hadoop), path, f"{scheme}://{path}")
        if scheme == LOCAL_SCHEME:
            return cls.local(Path(urllib.parse.unquote(urllib.parse.urlsplit(text).path)))
        return cls.local(Path(text))

    @classmethod
    def local(cls, path: Path) -> Location:
        absolute = os.path.abspath(path)
        return cls(pafs.LocalFileSystem(), absolute, absolute)

    @property
    def is_local(self) -> bool:
        return isinstance(self.filesystem, pafs.LocalFileSystem)

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    @property
    def parent(self) -> Location:
        return Location(self.filesystem, posixpath.dirname(self.path), posixpath.dirname(self.uri))

    def __truediv__(self, name: str) -> Location:
        return Location(self.filesystem, f"{self.path}/{name}", f"{self.uri}/{name}")

    def relative_to(self, root: Location) -> str:
        return posixpath.relpath(self.path, root.path)

    def __str__(self) -> str:
        return self.uri

    # --- reading ------------------------------------------------------------------------------

    def is_file(self) -> bool:
        return bool(self.filesystem.get_file_info(self.path).type == pafs.FileType.File)

    def is_dir(self) -> bool:
        return bool(self.filesystem.get_file_info(self.path).type == pafs.FileType.Directory)

    def files(self, pattern: str = "*") -> list[Location]:
        """The files below this directory whose path relative to it matches ``pattern`` segment
        by segment (``object=*/commit_date=*/*.parquet``: three levels down), sorted; none when
        the directory does not exist."""
        depth = pattern.count("/") + 1
        selector = pafs.FileSelector(self.path, allow_not_found=True, recursive=depth > 1)
        found = []
        for info in self.filesystem.get_file_info(selector):
            relative = posixpath.relpath(info.path, self.path)
            if info.type == pafs.FileType.File and _matches(relative, pattern):
                found.append(self / relative)
        return sorted(found, key=lambda location: location.path)

    def directories(self, pattern: str = "*") -> list[Location]:
        """The directories right under this one whose names match ``pattern``, sorted."""
        selector = pafs.FileSelector(self.path, allow_not_found=True)
        return sorted(
            (
                self / info.base_name
                for info in self.filesystem.get_file_info(selector)
                if info.type == pafs.FileType.Directory and fnmatch.fnmatchcase(info.base_name, pattern)
            ),
            key=lambda location: location.path,
        )

    def read_bytes(self) -> bytes:
        with self.filesystem.open_input_stream(self.path) as stream:
            return bytes(stream.readall())

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def open_input(self) -> pa.NativeFile:
        """The file for random access (Parquet, Arrow IPC): on a disk memory-mapped, so its
        contents are not copied into the process's heap."""
        if self.is_local:
            return pa.memory_map(self.path)
        return self.filesystem.open_input_file(self.path)

    def read_arrow(self) -> pa.Table:
        """An Arrow IPC file (:meth:`write_arrow`), memory-mapped on a disk (:meth:`open_input`)."""
        with self.open_input() as source:
            return pa.ipc.open_file(source).read_all()

    # --- writing ------------------------------------------------------------------------------

    def write_whole(self, write: Callable[[pa.NativeFile], None]) -> None:
        """``write`` the file's contents to a stream; the file appears whole or not at all (see
        the module's docstring)."""
        temporary = self.parent / f".{self.name}.tmp"
        if self.is_local:
            self.filesystem.create_dir(temporary.parent.path, recursive=True)
        with self.filesystem.open_output_stream(temporary.path) as stream:
            write(stream)
        self.filesystem.move(temporary.path, self.path)

    def write_arrow(self, table: pa.Table) -> None:
        """``table`` as an Arrow IPC file, whole or not at all (:meth:`write_whole`)."""

        def write(stream: pa.NativeFile) -> None:
            with pa.ipc.new_file(stream, table.schema) as writer:
                writer.write_table(table)

        self.write_whole(write)

    def write_bytes(self, data: bytes) -> None:
        self.write_whole(lambda stream: stream.write(data))

    def move_to(self, target: Location) -> None:
        """This file to ``target`` (replaced if it exists), on the same file system."""
        if self.is_local:
            self.filesystem.create_dir(target.parent.path, recursive=True)
        self.filesystem.move(self.path, target.path)

    def delete(self) -> None:
        """This file, if it exists."""
        with contextlib.suppress(FileNotFoundError):
            self.filesystem.delete_file(self.path)

    def delete_tree(self) -> None:
        """This directory and everything in it, if it exists."""
        if self.filesystem.get_file_info(self.path).type == pafs.FileType.Directory:
            self.filesystem.delete_dir(self.path)


def _matches(relative: str, pattern: str) -> bool:
    parts, wanted = relative.split("/"), pattern.split("/")
    return len(parts) == len(wanted) and all(
        fnmatch.fnmatchcase(part, want) for part, want in zip(parts, wanted, strict=True)
    )


@dataclass(frozen=True)
class ConsumerLocations:
    """Every place one consumer keeps files, resolved against the Hadoop settings of its session."""

    output: Location
    checkpoint: Location
    #: The driver's own directory: the DuckDB replica's file, Spark's logs, the dedupe memory's
    #: working copy.
    local: Path

    @classmethod
    def of(cls, config: ConsumerConfig, hadoop: Mapping[str, str] | None = None) -> ConsumerLocations:
        """``config``'s locations; ``hadoop`` defaults to the Hadoop settings among its
        ``--spark-conf`` (``spark.hadoop.*``)."""
        settings = hadoop_settings(config.spark_conf) if hadoop is None else hadoop
        return cls(
            Location.parse(config.output_dir, settings),
            Location.parse(config.checkpoint_location, settings),
            config.local_directory,
        )

    @property
    def spark_checkpoint(self) -> Location:
        """Spark's own checkpoint (offsets, commits, the query id)."""
        return self.checkpoint / "spark"

    @property
    def dedupe(self) -> Location:
        return self.checkpoint / "dedupe"

    @property
    def schemas(self) -> Location:
        return self.checkpoint / "schemas"

    @property
    def changelog(self) -> Location:
        return self.output / "changelog"

    @property
    def quarantine(self) -> Location:
        return self.output / "quarantine"

    @property
    def outlines(self) -> Location:
        """Where the tasks stage each batch's outline rows for the driver."""
        return self.output / "outline-staging"

    @property
    def replica_staging(self) -> Location:
        """Where the tasks stage each batch's replica rows for the driver."""
        return self.output / "replica-staging"

    @property
    def on_object_store(self) -> bool:
        return not (self.output.is_local and self.checkpoint.is_local)
