"""``make demo``: the bank workload, the whole pipeline on the embedded stack, and its checks."""

#: The workload's default rate (``spanner-cdc demo --rate``; ``make bench`` measures latency at it).
DEFAULT_TRANSFERS_PER_SECOND = 20
