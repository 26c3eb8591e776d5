"""Backfill: the rows each table held at the stream's start, read at one snapshot and published
as INSERT events, with where each table stands kept on the control topic.

May import ``publish``, ``spanner`` and ``lineage``; not the change-stream reading.
"""
