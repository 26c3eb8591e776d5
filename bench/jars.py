"""The JVM artifacts only the benchmarks run with: ``bench/<set>/pom.xml``, resolved by
``make bench`` into the environment's ``share/spanner-cdc/bench-jars/<set>/``."""

from __future__ import annotations

from pathlib import Path

from spanner_cdc.common.jars import jars_root


def bench_jars(set_name: str) -> list[Path]:
    found = sorted((jars_root().parent / "bench-jars" / set_name).glob("*.jar"))
    if not found:
        raise RuntimeError(f"no {set_name} jars: run make bench (it resolves bench/{set_name}/pom.xml)")
    return found
