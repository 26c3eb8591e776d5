"""A topic's limit counts a stored batch, the client's a message: the two kept apart."""

from __future__ import annotations

import pytest

from spanner_cdc.producer.publish.kafka import messages_fitting, topic_limit_for


@pytest.mark.parametrize("topic_limit", [1_100, 20_000, 1_048_588, 8_388_608, 100_000_007])
def test_messages_that_fit_a_topic_need_no_more_than_its_limit(topic_limit: int) -> None:
    fitting = messages_fitting(topic_limit)
    assert topic_limit_for(fitting) <= topic_limit < topic_limit_for(fitting + 2)


@pytest.mark.parametrize("message_bytes", [10_000, 1_000_000, 10_485_760])
def test_a_topic_made_for_the_client_takes_its_messages_and_their_batch(message_bytes: int) -> None:
    assert messages_fitting(topic_limit_for(message_bytes)) >= message_bytes - 1
    assert topic_limit_for(message_bytes) - message_bytes >= message_bytes // 250 + 100  # lz4's growth
