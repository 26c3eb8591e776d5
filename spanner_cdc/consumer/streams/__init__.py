"""Snowflake/Databend-style streams and CHANGES over the replica (seeds 003 and 004)."""
