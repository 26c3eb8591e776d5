"""A ``--group``'s shards and their checkpoints: the consumer-group membership, a shard taken
and handed back, the checkpoint rounds, and the checkpoints each transaction carries.

May import ``changestream`` and everything below it; not backfill or poll.
"""
