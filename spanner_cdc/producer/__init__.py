"""Spanner change streams → Kafka (``spanner-cdc produce``): built in the producer issue."""
