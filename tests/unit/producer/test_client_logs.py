"""librdkafka's logs of the producer's clients, as they reach the user's screen."""

from __future__ import annotations

import logging
import time

import pytest

from spanner_cdc.producer.publish.kafka import KafkaClient

#: Nothing listens there: the client is made and polled, never connected, and logs that.
NOWHERE = "127.0.0.1:9"


def test_readers_do_not_warn_about_the_writers_settings_of_the_shared_config(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``--kafka-config`` goes to every client of the producer; its readers warned once per
    producer setting in it (``linger.ms``, ``message.timeout.ms``) at every start. Their
    other lines still come (here: the broker cannot be reached)."""
    kafka = KafkaClient(NOWHERE, "logs", {"linger.ms": "100", "message.timeout.ms": "5000"}, 1, 1)
    with caplog.at_level(logging.INFO):
        reader = kafka.consumer("logs")
        give_up = time.monotonic() + 10
        while not any("Connect to" in record.getMessage() for record in caplog.records):
            assert time.monotonic() < give_up, "the reader logged nothing"
            reader.poll(0.1)  # serves the client's logs
        reader.close()
    lines = [record.getMessage() for record in caplog.records]
    assert not [line for line in lines if "producer property" in line], lines
