"""spanner-cdc: Cloud Spanner change streams → Kafka → Spark sinks (see docs/design.md §8 for
the layers: cli > demo, reference > stack > producer | consumer > common > schemas > errors)."""
