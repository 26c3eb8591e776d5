"""Snowflake/Databend-style streams and CHANGES over the replica."""
