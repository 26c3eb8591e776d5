"""Spanner change streams → Kafka (``spanner-cdc produce``; docs/producer.md)."""
