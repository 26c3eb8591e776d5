r"""Kafka topic names of one change stream: the events of each table and the control topics.

Events of table ``T`` go to ``{prefix}.T``, so ``{prefix}\..*`` selects events and nothing else
(what a Kafka Connect sink or a ksqlDB stream is given). The control topics live outside that
namespace, under ``_spanner-cdc.{prefix}.``: writer schemas (``.schemas``), the producer's
checkpoints (``.checkpoints``) and backfills (``.backfills``), the poller's positions
(``.polls``), and events Kafka refused for their size (``.dead_letters``).
Version 0.1 kept them as ``{prefix}._schemas`` and so on; :attr:`Topics.moved` names
those that a producer moves (``producer/publish/topic_move.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from spanner_cdc.schemas.errors import ContractError

#: What Kafka accepts as a topic name.
TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}\Z")


class TopicNameError(ContractError):
    """A table whose name gives a topic name Kafka does not accept."""


#: Where the control topics of every prefix live, apart from the event topics.
CONTROL_NAMESPACE = "_spanner-cdc"


@dataclass(frozen=True)
class Topics:
    """The names of every topic of one topic prefix: ``{prefix}.{table}`` for events, and the
    control topics under ``_spanner-cdc.{prefix}.``."""

    prefix: str

    @property
    def schemas(self) -> str:
        return f"{CONTROL_NAMESPACE}.{self.prefix}.schemas"

    def writer_transactional_id(self, shard: int, shards: int) -> str:
        """The Kafka transactional id of the writer of one shard of the checkpoint topic
        (producer.publish.transactions): the prefix's one writer when there is one shard."""
        writer = f"{CONTROL_NAMESPACE}.{self.prefix}.writer"
        return writer if shards == 1 else f"{writer}.shard-{shard}"

    def group_id(self, group: str) -> str:
        """The Kafka consumer group of the producer processes started with ``--group group``."""
        return f"{CONTROL_NAMESPACE}.{self.prefix}.producers.{group}"

    @property
    def checkpoints(self) -> str:
        return f"{CONTROL_NAMESPACE}.{self.prefix}.checkpoints"

    @property
    def backfills(self) -> str:
        """The producer's backfill plans and progress (``producer/backfill/store.py``)."""
        return f"{CONTROL_NAMESPACE}.{self.prefix}.backfills"

    @property
    def polls(self) -> str:
        """Where ``spanner-cdc poll`` stands per table (``producer/poll/store.py``)."""
        return f"{CONTROL_NAMESPACE}.{self.prefix}.polls"

    @property
    def dead_letters(self) -> str:
        """What could not go to its event topic (an event over the size Kafka accepts), and why."""
        return f"{CONTROL_NAMESPACE}.{self.prefix}.dead_letters"

    @property
    def control(self) -> tuple[str, ...]:
        """Every control topic of the prefix."""
        return (self.schemas, self.checkpoints, self.backfills, self.polls, self.dead_letters)

    @property
    def moved(self) -> dict[str, str]:
        """The compacted control topics of version 0.1 → where they are now. (Their dead
        letters are a log of past refusals, not state: they stay where they are.)"""
        return {f"{self.prefix}._schemas": self.schemas, f"{self.prefix}._checkpoints": self.checkpoints}

    def event(self, table: str) -> str:
        topic = f"{self.prefix}.{table}"
        if not TOPIC_NAME.match(topic):
            raise TopicNameError(
                f"table {table!r} gives the topic name {topic!r}, which Kafka does not accept"
            )
        return topic

    @property
    def event_pattern(self) -> str:
        """A regular expression that matches every event topic and nothing else of the prefix —
        also not the old control topics (``{prefix}._schemas``) nor those of a longer prefix
        (``{prefix}.Test._schemas``): every dot-separated part of a table name starts with a letter.
        Anchored at both ends: Spark's ``subscribePattern`` finds the pattern anywhere in a topic's
        name, and ``_spanner-cdc.{prefix}.schemas`` holds the prefix too."""
        return "^" + re.escape(self.prefix) + r"(\.[A-Za-z][^.]*)+$"

    def is_event_topic(self, name: str) -> bool:
        return re.fullmatch(self.event_pattern, name) is not None
