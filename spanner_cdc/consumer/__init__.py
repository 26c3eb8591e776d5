"""Kafka → Spark → changelog, replica and quarantine (``spanner-cdc consume``; docs/consumer.md)."""
