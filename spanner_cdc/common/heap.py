"""What a long-running command made at start-up, kept out of the garbage collector's walks."""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Collect once, then move every object alive now out of the cyclic collector's reach.

    A command's start-up leaves a large heap that lives as long as the process: the modules of
    the Spanner, gRPC, protobuf and Kafka clients, the clients, the catalog. CPython's full
    collections walk every tracked object, and the producer's per-event garbage triggers one
    every few thousand events, so they walked that heap again and again: a large share of the
    event loop's time (docs/producer.md, Performance). Frozen objects are still freed by
    reference counting; a reference cycle among them is never collected, so what can stay
    behind is bounded by the start-up heap itself, once: it cannot grow with the run.
    """
    gc.collect()
    gc.freeze()
