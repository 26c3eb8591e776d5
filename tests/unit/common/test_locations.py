"""Where the consumer's files go: a path or a ``file://`` URI; any other scheme is refused in one
line instead of becoming a local directory named after it (spanner_cdc.common.config)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spanner_cdc.consumer.api import ConfigError, consumer_config

REQUIRED = {"kafka_bootstrap": "broker:9092", "topic_prefix": "Bank"}


@pytest.fixture(autouse=True)
def no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SPANNER_CDC_CONFIG", "SPANNER_CDC_OUTPUT_DIR", "SPANNER_CDC_CHECKPOINT_DIR"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("given", "directory"),
    [
        ("data", Path("data")),
        ("/shared/cdc", Path("/shared/cdc")),
        ("file:///shared/cdc", Path("/shared/cdc")),
        ("FILE:///shared/my%20cdc", Path("/shared/my cdc")),
    ],
)
def test_a_path_or_a_file_uri_is_a_directory(given: str, directory: Path) -> None:
    config = consumer_config({**REQUIRED, "output_dir": given})
    assert config.output_dir == directory
    assert config.changelog_dir == directory / "changelog"
    assert config.spark_checkpoint == directory / "checkpoint" / "spark"


@pytest.mark.parametrize("scheme", ["s3a", "s3", "gs", "abfss", "hdfs", "wasbs"])
@pytest.mark.parametrize("option", ["output_dir", "checkpoint_dir"])
def test_an_object_store_or_hdfs_uri_is_refused_in_one_line(scheme: str, option: str) -> None:
    with pytest.raises(ConfigError) as raised:
        consumer_config({**REQUIRED, "output_dir": "data", option: f"{scheme}://bucket/cdc"})
    said = str(raised.value)
    assert said.startswith(f"--{option.replace('_', '-')}: invalid value '{scheme}://bucket/cdc'"), said
    assert f"{scheme}:// locations are not supported yet" in said
    assert "\n" not in said
