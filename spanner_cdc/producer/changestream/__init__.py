"""Reading the change stream: one task per partition, its query run and retried, one action per
record type, held records released in commit order, the gauges read from the partition table.

May import ``publish``, ``spanner`` and ``lineage``; not the group's shards, backfill or poll.
"""
