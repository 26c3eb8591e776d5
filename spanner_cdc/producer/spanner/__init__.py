"""The Spanner side: opening the database, the change-stream query and its rows, the table
catalog, snapshot reads (backfill, poll, whole rows), and the blocking reads on worker threads.

Imports nothing of the producer but its configuration, the change-stream rules, the retry rule and
the errors; knows nothing of Kafka.
"""
