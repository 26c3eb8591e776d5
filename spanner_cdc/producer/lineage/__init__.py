"""The change stream's partitions as a model, without I/O: their lineage and states, what
Kafka acknowledged of each, and from those the low watermark and the commit-order release.

Imports nothing of the producer but its configuration, metrics and errors.
"""
