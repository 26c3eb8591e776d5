"""The library's options: ``consume``'s, by their Python names, parsed and checked as the
command's are (spanner_cdc.consumer.api)."""

from __future__ import annotations

import pytest

from spanner_cdc.consumer import api
from spanner_cdc.consumer.api import ConfigError, consumer_config
from spanner_cdc.consumer.locations import ConsumerLocations

REQUIRED = {"kafka_bootstrap": "broker:9092", "topic_prefix": "Bank", "output_dir": "/shared/cdc"}


@pytest.fixture(autouse=True)
def no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SPANNER_CDC_CONFIG", "SPANNER_CDC_KAFKA_BOOTSTRAP", "SPANNER_CDC_SINKS"):
        monkeypatch.delenv(name, raising=False)


def test_python_values_become_the_command_s_values() -> None:
    config = consumer_config(
        {
            **REQUIRED,
            "kafka_config": {"security.protocol": "SASL_SSL"},
            "whole_transactions": False,
            "sinks": ["changelog"],
            "max_events_per_batch": 300,
        }
    )
    assert config.output_dir == "/shared/cdc"
    assert ConsumerLocations.of(config).spark_checkpoint.uri == "/shared/cdc/checkpoint/spark"
    assert config.kafka_config == {"security.protocol": "SASL_SSL"}
    assert config.whole_transactions is False
    assert config.sinks == ("changelog",)
    assert config.max_events_per_batch == 300


def test_the_environment_fills_what_the_job_does_not_give(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPANNER_CDC_SINKS", "replica")
    assert consumer_config(REQUIRED).sinks == ("replica",)
    assert consumer_config({**REQUIRED, "sinks": ["changelog"]}).sinks == ("changelog",)


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({**REQUIRED, "output_directory": "/x"}, "unknown consumer option(s): output_directory"),
        ({**REQUIRED, "max_events_per_batch": "lots"}, "--max-events-per-batch: invalid value 'lots'"),
        ({"topic_prefix": "Bank", "output_dir": "/x"}, "--kafka-bootstrap is required"),
        (
            {**REQUIRED, "replica": "postgres", "sinks": ["replica"]},
            "--replica postgres needs --postgres-dsn",
        ),
    ],
)
def test_a_bad_option_is_one_error_naming_it(options: dict[str, object], said: str) -> None:
    with pytest.raises(ConfigError) as raised:
        consumer_config(options)
    assert said in str(raised.value)


def test_the_public_names_are_documented() -> None:
    for name in api.__all__:
        assert getattr(api, name).__doc__, name
