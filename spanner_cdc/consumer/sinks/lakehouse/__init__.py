"""The replica as Delta Lake tables, written by Spark (``--replica delta``).

The same rules as the SQL replicas — drop what is not newer than a key's stored change, fold a
key's changes, whole transactions up to a consistent cut — with Delta's guarantees in place of
one database transaction: every table's MERGE is committed with Delta's transaction
identifiers, so a replayed batch changes nothing twice, and the cut, the held events and the
batch marker are kept in a ledger written after the tables (ledger.py).

May import ``sinks.replica`` (the cut, the stage rows, names, stopped tables) and ``decode``.
"""
