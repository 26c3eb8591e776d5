"""``--kafka-config`` (librdkafka's names) as the Java client of Spark's Kafka source needs it."""

from __future__ import annotations

from spanner_cdc.consumer.config import java_client_settings

SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"


def test_a_user_and_password_become_the_java_clients_jaas_line() -> None:
    settings = java_client_settings(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": "SCRAM-SHA-512",  # librdkafka's alias
            "sasl.username": "cdc",
            "sasl.password": 'p"a\\ss',
        }
    )
    assert settings == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": f'{SCRAM} required username="cdc" password="p\\"a\\\\ss";',
    }


def test_a_jaas_line_given_wins_and_other_mechanisms_pass_through() -> None:
    given = {"sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p", "sasl.jaas.config": "X;"}
    assert java_client_settings(given) == {"sasl.mechanism": "PLAIN", "sasl.jaas.config": "X;"}
    oauth = {"sasl.mechanism": "OAUTHBEARER", "sasl.username": "u"}
    assert java_client_settings(oauth) == {"sasl.mechanism": "OAUTHBEARER"}
    assert java_client_settings({"client.id": "c"}) == {"client.id": "c"}
