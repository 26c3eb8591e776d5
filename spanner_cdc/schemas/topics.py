"""Kafka topic names of one change stream: the events of each table and the two control topics.

Events of table ``T`` go to ``{prefix}.T``; writer schemas to ``{prefix}._schemas``, the
producer's checkpoints to ``{prefix}._checkpoints`` and events Kafka refused for their size to
``{prefix}._dead_letters``. Table names start with a letter and control
topics with ``_``, so a pattern can tell them apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from spanner_cdc.schemas.errors import ContractError

#: What Kafka accepts as a topic name.
TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}\Z")


class TopicNameError(ContractError):
    """A table whose name gives a topic name Kafka does not accept."""


@dataclass(frozen=True)
class Topics:
    prefix: str

    @property
    def schemas(self) -> str:
        return f"{self.prefix}._schemas"

    @property
    def checkpoints(self) -> str:
        return f"{self.prefix}._checkpoints"

    @property
    def dead_letters(self) -> str:
        """What could not go to its event topic (an event over the size Kafka accepts), and why."""
        return f"{self.prefix}._dead_letters"

    def event(self, table: str) -> str:
        topic = f"{self.prefix}.{table}"
        if not TOPIC_NAME.match(topic):
            raise TopicNameError(
                f"table {table!r} gives the topic name {topic!r}, which Kafka does not accept"
            )
        return topic

    @property
    def event_pattern(self) -> str:
        """A regular expression that matches every event topic and no control topic — also not
        those of a longer prefix such as ``{prefix}.Test._schemas``: every dot-separated part of a
        table name starts with a letter, every control topic's last part with ``_``."""
        return re.escape(self.prefix) + r"(\.[A-Za-z][^.]*)+"

    def is_event_topic(self, name: str) -> bool:
        return re.fullmatch(self.event_pattern, name) is not None
