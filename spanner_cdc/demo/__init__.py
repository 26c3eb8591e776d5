"""``make demo``: the bank workload, the whole pipeline on the embedded stack, and its checks."""
