"""The event contract between producer and consumer (docs/design.md §3).

Everything that decides how a Spanner change becomes bytes on Kafka lives here, so that the
producer, the consumer and third-party readers agree by construction: Spanner → Avro type
mapping and value conversion, per-table Avro schemas, ``schema_key``, the deterministic event
uuid, ``sort_keys``, the CRC-64-AVRO fingerprint and Avro single-object encoding.
"""
