"""The poller's position and configuration, without services."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from typing import Any

import pytest

from spanner_cdc.common.config import ConfigError
from spanner_cdc.producer.poll.config import PollConfig
from spanner_cdc.producer.poll.poller import run_unless_stopped
from spanner_cdc.producer.poll.store import PollPosition

STAMP = 1_700_000_000_000_000


def config(**overrides: Any) -> PollConfig:
    options: dict[str, Any] = {
        "project": "p",
        "instance": "i",
        "database": "d",
        "table": "Docs",
        "commit_timestamp_column": "Stamp",
        "kafka_bootstrap": "k:9092",
    }
    return PollConfig(**{**options, **overrides})


def test_the_boundary_keys_are_those_published_at_exactly_the_newest_stamp() -> None:
    position = PollPosition("Docs", "Stamp", 0, 0)
    position.passed(STAMP, ("1",))
    position.passed(STAMP, ("2",))
    position.passed(STAMP, ("2",))  # read again at the boundary: kept once
    assert position.boundary_keys == [["1"], ["2"]]
    assert position.published(STAMP, ("2",)) and position.published(STAMP - 1, ("9",))
    assert not position.published(STAMP, ("3",))  # another transaction at the same stamp
    position.passed(STAMP + 1, ("1",))
    assert (position.boundary_micros, position.boundary_keys) == (STAMP + 1, [["1"]])
    assert position.published(STAMP, ("3",)) and not position.published(STAMP + 1, ("2",))


def test_a_position_survives_its_json_and_a_malformed_one_is_refused() -> None:
    position = PollPosition("Docs", "Stamp", STAMP - 5, STAMP, [["1", "a"]])
    again = PollPosition.from_json(json.loads(json.dumps(asdict(position))))
    assert asdict(again) == asdict(position)
    assert again.published(STAMP, ("1", "a"))
    for broken in (
        {**asdict(position), "boundary_keys": "1"},
        {**asdict(position), "boundary_keys": [1]},
    ):
        with pytest.raises(ValueError, match="boundary_keys"):
            PollPosition.from_json(broken)
    with pytest.raises(KeyError):
        PollPosition.from_json({"table": "Docs"})


def test_the_poll_configuration_defaults_and_refusals() -> None:
    made = config()
    assert made.topic_prefix == "poll-Docs"
    assert made.stream_name == "projects/p/instances/i/databases/d/tables/Docs"
    assert made.start_timestamp_micros == 0
    with pytest.raises(ConfigError, match="one table"):
        config(table="Doc*")


def test_a_stop_ends_a_running_poll_at_once_and_a_finished_poll_keeps_its_outcome() -> None:
    async def scenario() -> None:
        stop = asyncio.Event()
        cancelled = asyncio.Event()

        async def endless() -> None:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        async def failing() -> None:
            raise RuntimeError("the read failed")

        async def quick() -> None:
            return None

        asyncio.get_running_loop().call_later(0.05, stop.set)
        assert await run_unless_stopped(endless(), stop) is False
        assert cancelled.is_set()
        stop.clear()
        assert await run_unless_stopped(quick(), stop) is True
        with pytest.raises(RuntimeError, match="the read failed"):
            await run_unless_stopped(failing(), stop)

    asyncio.run(scenario())
