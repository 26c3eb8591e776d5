"""Kafka → Spark → changelog, replica and quarantine (``spanner-cdc consume``; docs/consumer.md).

A PySpark job of your own uses the public surface, :mod:`spanner_cdc.consumer.api`; every other
module here is the consumer's inside and may change between versions."""
