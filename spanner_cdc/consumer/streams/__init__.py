"""Snowflake/Databend-style streams and CHANGES over the replica (``spanner-cdc stream``,
``changes``): the streams' catalog in the replica database, their offsets, and a table's change
between two cuts.

Reads what the replica sink wrote; may import ``sinks`` and ``decode``, never the other way.
"""
