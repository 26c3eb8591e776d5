"""Prints every benchmark's figures; targets from the issues are printed beside them."""

from __future__ import annotations

import argparse
import resource

from bench import contract


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--events", type=int, default=50_000, help="events per measurement")
    args = parser.parse_args()

    figures = contract.run(args.events)
    baseline = figures[0]
    print(f"{'measurement':45} {'events':>9} {'seconds':>8} {'events/s':>11} {'vs baseline':>11}")
    for figure in figures:
        ratio = figure.per_second / baseline.per_second
        rate = f"{figure.per_second:11,.0f}"
        print(f"{figure.name:45} {figure.events:9d} {figure.seconds:8.2f} {rate} {ratio:10.2f}x")
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS: {peak_mib:.0f} MiB")


if __name__ == "__main__":
    main()
