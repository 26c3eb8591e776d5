"""The consumer's Spark runtime: the session, stopping between micro-batches, Spark's Kafka
source's offsets when records were lost, and the Python workers' bytecode and garbage collector.

Imports nothing of the consumer but its errors.
"""
