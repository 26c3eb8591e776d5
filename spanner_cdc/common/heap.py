"""The garbage collector set for a long-running command that makes garbage per event."""

from __future__ import annotations

import gc

#: Container allocations (net of frees) between two collections of the youngest generation,
#: and how many collections of one generation make one of the next. CPython's defaults
#: (700, 10, 10) suit short scripts: here every event in flight — kept until its transaction
#: commits, some 10,000 at a time — lived through several collections of every generation,
#: each walking all of them again (docs/producer.md, Performance).
THRESHOLDS = (10_000, 20, 20)


def settle_heap() -> None:
    """Collect once, move every object alive now out of the cyclic collector's reach, and
    collect less often from now on.

    A command's start-up leaves a large heap that lives as long as the process: the modules of
    the Spanner, gRPC, protobuf and Kafka clients, the clients, the catalog. CPython's full
    collections walk every tracked object, and the producer's per-event garbage triggers one
    every few thousand events, so they walked that heap again and again. Frozen objects are
    still freed by reference counting; a reference cycle among them is never collected, so what
    can stay behind is bounded by the start-up heap itself, once: it cannot grow with the run.
    The rarer collections only delay freeing the few cycles events make (none is made per
    event): reference counting frees the rest at once, as before.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
