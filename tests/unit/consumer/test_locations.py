"""Where the consumer's files go: a path, a ``file://`` URI or an ``s3a://`` URI, each made into
the right file system and path; any other scheme is refused in one line instead of becoming a
local directory named after it (spanner_cdc.consumer.config, spanner_cdc.consumer.locations)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from spanner_cdc.consumer.api import ConfigError, consumer_config
from spanner_cdc.consumer.locations import ConsumerLocations, Location, s3_filesystem

REQUIRED = {"kafka_bootstrap": "broker:9092", "topic_prefix": "Bank"}


@pytest.fixture(autouse=True)
def no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "SPANNER_CDC_CONFIG",
        "SPANNER_CDC_OUTPUT_DIR",
        "SPANNER_CDC_CHECKPOINT_DIR",
        "SPANNER_CDC_LOCAL_DIR",
        "SPANNER_CDC_SPARK_CONF",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("given", "directory"),
    [
        ("data", os.path.abspath("data")),
        ("/shared/cdc", "/shared/cdc"),
        ("file:///shared/cdc", "/shared/cdc"),
        ("FILE:///shared/my%20cdc", "/shared/my cdc"),
    ],
)
def test_a_path_or_a_file_uri_is_a_local_directory(given: str, directory: str) -> None:
    config = consumer_config({**REQUIRED, "output_dir": given})
    locations = ConsumerLocations.of(config)
    assert isinstance(locations.output.filesystem, pafs.LocalFileSystem)
    assert locations.changelog.path == f"{directory}/changelog"
    assert locations.spark_checkpoint.uri == f"{directory}/checkpoint/spark"
    assert os.path.abspath(config.duckdb_path) == f"{directory}/replica.duckdb"


def test_an_s3a_uri_is_a_bucket_and_key_on_s3() -> None:
    config = consumer_config(
        {
            **REQUIRED,
            "output_dir": "s3a://cdc-bucket/bank/",
            "spark_conf": {
                "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
                "spark.hadoop.fs.s3a.path.style.access": "true",
            },
        }
    )
    locations = ConsumerLocations.of(config)
    assert isinstance(locations.output.filesystem, pafs.S3FileSystem)
    assert locations.changelog.path == "cdc-bucket/bank/changelog"
    assert locations.changelog.uri == "s3a://cdc-bucket/bank/changelog"
    assert locations.spark_checkpoint.uri == "s3a://cdc-bucket/bank/checkpoint/spark"
    assert locations.on_object_store
    # What must be on the driver's disk is not in the bucket.
    assert config.local_directory == Path("spanner-cdc-local")


def test_a_checkpoint_and_a_local_directory_of_their_own() -> None:
    config = consumer_config(
        {
            **REQUIRED,
            "output_dir": "s3a://cdc-bucket/out",
            "checkpoint_dir": "s3a://other-bucket/ckpt",
            "local_dir": "/var/lib/cdc",
        }
    )
    locations = ConsumerLocations.of(config)
    assert locations.dedupe.uri == "s3a://other-bucket/ckpt/dedupe"
    assert config.duckdb_path == Path("/var/lib/cdc/replica.duckdb")


def options(filesystem: pafs.S3FileSystem) -> dict[str, object]:
    """The arguments a pyarrow S3 file system was made with (what it pickles)."""
    arguments: dict[str, object] = filesystem.__reduce__()[1][0]
    return arguments


def test_the_s3a_settings_become_pyarrow_s_with_a_bucket_s_own_winning() -> None:
    hadoop = {
        "fs.s3a.endpoint": "storage.example:9000",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.access.key": "general",
        "fs.s3a.secret.key": "general-secret",
        "fs.s3a.bucket.special.access.key": "special",
        "fs.s3a.bucket.special.endpoint": "https://special.example",
        "fs.s3a.endpoint.region": "eu-west-1",
        "fs.s3a.path.style.access": "true",
    }
    general = options(s3_filesystem("cdc-bucket", hadoop))
    assert general["endpoint_override"] == "storage.example:9000"
    assert (general["scheme"], general["region"], general["force_virtual_addressing"]) == (
        "http",
        "eu-west-1",
        False,
    )
    assert (general["access_key"], general["secret_key"]) == ("general", "general-secret")
    special = options(s3_filesystem("special", hadoop))
    assert (special["endpoint_override"], special["scheme"]) == ("special.example", "https")
    assert (special["access_key"], special["secret_key"]) == ("special", "general-secret")


def test_without_settings_the_sdk_s_defaults_decide() -> None:
    """No endpoint, keys or region: AWS itself, credentials from the SDK's default chain (the
    environment, a profile, the instance's role), as Hadoop's default provider list does."""
    found = options(s3_filesystem("cdc-bucket", {}))
    assert (found["endpoint_override"], found["access_key"], found["anonymous"]) == ("", None, False)
    anonymous = {
        "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.AnonymousAWSCredentialsProvider"
    }
    assert options(s3_filesystem("public", anonymous))["anonymous"] is True


@pytest.mark.parametrize("scheme", ["s3", "gs", "abfss", "hdfs", "wasbs"])
@pytest.mark.parametrize("option", ["output_dir", "checkpoint_dir"])
def test_another_scheme_is_refused_in_one_line(scheme: str, option: str) -> None:
    with pytest.raises(ConfigError) as raised:
        consumer_config({**REQUIRED, "output_dir": "data", option: f"{scheme}://bucket/cdc"})
    said = str(raised.value)
    assert said.startswith(f"--{option.replace('_', '-')}: invalid value '{scheme}://bucket/cdc'"), said
    assert f"{scheme}:// locations are not supported" in said
    assert "\n" not in said


def test_an_s3a_uri_without_a_bucket_is_refused() -> None:
    with pytest.raises(ConfigError, match="names its bucket"):
        consumer_config({**REQUIRED, "output_dir": "s3a:///cdc"})


def test_a_file_appears_whole_and_a_directory_lists_by_pattern(tmp_path: Path) -> None:
    root = Location.local(tmp_path)
    (root / "a/b/one.parquet").write_bytes(b"1")
    (root / "a/c/two.parquet").write_bytes(b"2")
    (root / "a/top.parquet").write_bytes(b"3")
    assert [f.relative_to(root) for f in root.files("a/*/*.parquet")] == [
        "a/b/one.parquet",
        "a/c/two.parquet",
    ]
    assert [f.name for f in (root / "a").files("*.parquet")] == ["top.parquet"]
    assert [d.name for d in (root / "a").directories()] == ["b", "c"]
    assert not list(tmp_path.rglob(".*.tmp"))
    (root / "a/b/one.parquet").move_to(root / "moved/one.parquet")
    assert (root / "moved/one.parquet").read_bytes() == b"1"
    (root / "a").delete_tree()
    assert root.files("a/*/*.parquet") == [] and not (root / "a").is_dir()
    (root / "missing").delete_tree()
    (root / "missing.parquet").delete()
