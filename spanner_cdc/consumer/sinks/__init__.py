"""Where a micro-batch goes: the changelog, the replica and the quarantine, side by side.

Each sink takes the whole decoded batch (:class:`BatchContents`) through one method,
``write(batch_id, contents)``, and must make a replay of the same batch id harmless: the Parquet
sinks replace their batch's files, the replica records the batch id in its own transaction.
"""
