"""What the tests and the benchmarks share to drive the pipeline: synthetic and recorded change
records published through the producer's real path, emulator databases, consumer runs.

Not part of the installed package (only ``spanner_cdc`` is); ``bench/`` and ``tests/`` import it
so that neither imports the other.
"""
