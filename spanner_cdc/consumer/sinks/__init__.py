"""Where a micro-batch goes: the changelog, the replica and the quarantine, side by side.

The tasks that decode a batch stage what each sink needs (the changelog's and quarantine's
Parquet files, the replica's stage rows); the driver publishes the files or runs the replica's
transaction once it knows what the batch keeps. Each must make a replay of the same batch id
harmless: the Parquet sinks replace their batch's files, the replica records the batch id in
its own transaction.

May import ``decode`` and the consumer's metrics and status; not the streams over the replica,
the tasks or the batch.
"""
