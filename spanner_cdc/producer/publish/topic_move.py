"""Moving the control topics of version 0.1 (``{prefix}._schemas``, ``{prefix}._checkpoints``)
to where they live now (``_spanner-cdc.{prefix}.…``, see ``schemas/topics.py``).

Both are compacted: what counts is the newest record per key. At every start, while an old
topic exists, each of its keys that the new topic lacks is copied there (newest value, acknowledged)
before anything else reads the new topic. Nothing writes the old topics any more, so a key already
in the new topic is as new or newer there, and the copy needs no marker to be safe: a producer
killed halfway copies the rest at its next start. Once a start has copied everything, the old
topics can be deleted (the log line says so); until then they are only read.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import closing

from confluent_kafka import KafkaException

from spanner_cdc.producer.errors import KafkaSetupError
from spanner_cdc.producer.publish.kafka import KafkaClient

log = logging.getLogger(__name__)


async def move_control_topics(kafka: KafkaClient, timeout: float = 60.0) -> None:
    """Copy what the new control topics lack from the old ones (call before reading them)."""
    existing = kafka.admin.list_topics(timeout=timeout).topics
    for old, new in kafka.topics.moved.items():
        if old not in existing:
            continue
        await kafka.ensure_topic(new, compacted=True)
        present = set(newest_records(kafka, new, timeout)) if new in existing else set()
        missing = {
            key: value
            for key, value in newest_records(kafka, old, timeout).items()
            if key not in present and value is not None
        }
        copies = [kafka.produce_acknowledged(new, key, value) for key, value in missing.items()]
        if await kafka.flush(timeout):
            raise KafkaSetupError(f"cannot copy {old} to {new}: Kafka did not acknowledge in {timeout:.0f} s")
        try:
            await asyncio.gather(*copies)
        except KafkaException as exc:
            raise KafkaSetupError(f"cannot copy {old} to {new}: {exc.args[0].str()}") from None
        if missing:
            log.info("moved %d record(s) from %s to %s", len(missing), old, new)
        log.info("%s is no longer used (everything in it is in %s): it can be deleted", old, new)


def newest_records(kafka: KafkaClient, topic: str, timeout: float) -> dict[bytes, bytes | None]:
    """key → newest value of a compacted topic (None: a tombstone)."""
    with closing(kafka.read_topic(topic, timeout)) as records:
        return {key: value for _offset, key, value in records if key is not None}
