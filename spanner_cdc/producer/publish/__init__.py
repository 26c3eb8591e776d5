"""The Kafka side: events encoded and produced inside transactions, their acknowledgements
tracked, watermark records, and the compacted control topics (checkpoints, backfill and poll
positions, their move from older names).

May import the partition model (``lineage``) and the Spanner side (a partial record's missing
columns); nothing that runs partitions.
"""
