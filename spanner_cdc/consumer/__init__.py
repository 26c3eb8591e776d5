"""Kafka → Spark sinks (``spanner-cdc consume``): built in the consumer issue."""
