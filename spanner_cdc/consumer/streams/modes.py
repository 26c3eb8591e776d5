"""The stream modes (consumer.streams.delta defines them); no imports, so the CLI can name them."""

MODES = ("standard", "append_only", "insert_only")
#: Snowflake's default; Databend defaults to append-only, which hides updates and deletes.
DEFAULT_MODE = "standard"
