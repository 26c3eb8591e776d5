"""spanner-cdc: Cloud Spanner change streams → Kafka → Spark sinks. CLI and embedded stack."""
