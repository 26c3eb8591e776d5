"""``spanner-cdc poll``: a table without a change stream, polled by its commit-timestamp column;
its own options, wiring, poller and stored position. Built on the produce command's wiring
(``producer.main``) and the backfill.
"""
