"""``make bench``: prints every benchmark's figures beside baselines measured in the same run."""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

from bench import consumer, group, peer, producer
from bench.producer import Figure, percentile
from spanner_cdc.demo import DEFAULT_TRANSFERS_PER_SECOND
from spanner_cdc.demo.run import run_bank
from spanner_cdc.producer.config import RELEASE_ORDERS
from spanner_cdc.stack import EmbeddedStack, stop_on_signals

PRODUCER_TARGET_EVENTS_PER_SECOND = 60_000
RAW_TARGET_EVENTS_PER_SECOND = 200_000
#: The changelog's target is also half the raw read of the same run (printed beside it).
CHANGELOG_TARGET_EVENTS_PER_SECOND = 100_000
#: Each replica's, with whole transactions.
REPLICA_TARGET_EVENTS_PER_SECOND = 50_000
#: Commit → replica p99 at the demo's rate.
PIPELINE_TARGET_P99_MS = 1_000
#: Commit → Kafka ack p99 of the producer (at 1,000 transactions/s).
LATENCY_TARGET_P99_MS = 1_000
#: Peak RSS of a producer with 1,000 partitions running.
PARTITIONS_TARGET_RSS_MIB = 300
#: Transactions/s of the peer part's latency runs (b).
PEER_RATE = 100.0


def print_figures(figures: list[Figure]) -> None:
    for figure in figures:
        rate = f"{figure.per_second:11,.0f} ev/s"
        cpu = ""
        if figure.cpu is not None:
            own, rest = (seconds / figure.events * 1e6 for seconds in (figure.cpu.own, figure.cpu.rest))
            cpu = f"; CPU per event: this process {own:,.1f} µs, the rest of the machine {rest:,.1f} µs"
        print(f"  {figure.name:52} {figure.events:8d} ev {figure.seconds:7.2f} s {rate}{cpu}")


def print_bounds(label: str, figure: Figure) -> None:
    """What the CPU a producer figure took allows: the event loop's thread (the figure's calling
    thread), which runs every event's Python, and the machine's CPUs, which it shares with the
    broker and the emulator."""
    assert figure.cpu is not None
    cpus = len(os.sched_getaffinity(0))
    loop, machine = figure.cpu.thread / figure.events, figure.cpu.machine / figure.events
    print(
        f"  {label} the event loop's thread {loop * 1e6:,.1f} µs of CPU an event "
        f"({figure.cpu.thread / figure.seconds:.0%} of the run): one thread allows at most "
        f"{1 / loop:,.0f} ev/s; the machine's {machine * 1e6:,.1f} µs: {cpus} CPUs allow at most "
        f"{cpus / machine:,.0f} ev/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--events", type=int, default=50_000, help="events for the pipeline measurement (a)")
    parser.add_argument(
        "--rows", type=int, default=20_000, help="rows committed for the emulator measurement (b)"
    )
    parser.add_argument(
        "--rates",
        type=float,
        nargs="+",
        default=[100.0, 1_000.0],
        help="transactions/s of the latency measurements (c), one run each",
    )
    parser.add_argument(
        "--heartbeats-ms",
        type=int,
        nargs="+",
        default=[1_000, 100],
        help="heartbeat intervals of the latency measurements (c), each with every rate",
    )
    parser.add_argument(
        "--release-orders",
        nargs="+",
        choices=RELEASE_ORDERS,
        default=list(RELEASE_ORDERS),
        help="--release-order of the latency measurements (c), each with every heartbeat and rate",
    )
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="length of the latency measurements ((c) and pipeline)"
    )
    parser.add_argument(
        "--backfill-rows", type=int, default=50_000, help="rows of the backfill (d) and poll (e) measurements"
    )
    parser.add_argument(
        "--group-rows", type=int, default=100_000, help="rows of the group's backlog measurement (g)"
    )
    parser.add_argument("--changes", type=int, default=100_000, help="changes for the consumer measurement")
    parser.add_argument(
        "--peer-rows", type=int, default=20_000, help="committed changes of the peer part's backlog (a)"
    )
    parser.add_argument("--only", choices=list(PART_RUNS), help="run one part only")
    args = parser.parse_args()

    with stop_on_signals():
        stack = EmbeddedStack.start(names=("spanner", "kafka", "postgres"))
        summaries: list[tuple[str, str]] = []
        try:
            for name, part in PART_RUNS.items():
                if args.only in (None, name):
                    summaries.append((name, run_part(name, part, stack, args)))
        finally:
            stack.stop()
    print("summary")
    for name, line in summaries:
        print(f"  {name:10} {line}")
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


def run_part(name: str, part: Part, stack: EmbeddedStack, args: argparse.Namespace) -> str:
    """One part's summary line; a part that fails prints its error in one line (the traceback
    goes to a file) and the bench goes on with the next."""
    try:
        return part(stack, args)
    except Exception as exc:
        trace = Path(tempfile.mkstemp(prefix=f"bench-{name}-", suffix=".txt")[1])
        trace.write_text(traceback.format_exc())
        first = str(exc).splitlines()[0] if str(exc) else ""
        line = f"failed: {type(exc).__name__}: {first} (traceback: {trace})"
        print(f"  {name}: {line}")
        return line


def group_part(_stack: EmbeddedStack, args: argparse.Namespace) -> str:
    print("several producer processes of a group, emulator tokens living 2-4 s")
    churning = EmbeddedStack.start(names=("spanner", "kafka"), churn_seconds=2)
    try:
        spanner, kafka = churning.endpoint("spanner"), churning.endpoint("kafka")
        figures, steady = group.backlog_figures(spanner, kafka, args.group_rows)
        print_figures(figures)
        alone, single, one, *more = figures
        print(
            f"  (g) 1 process without --group/client alone {single.per_second / alone.per_second:.2f}x, "
            f"1 process of a group/without {one.per_second / single.per_second:.2f}x"
        )
        for count, figure in enumerate(more, start=2):
            print(f"  (g) {count} processes/1 process of a group {figure.per_second / one.per_second:.2f}x")
        print_figures(steady)
        steady_single, steady_one, *steady_more = steady
        print(
            f"  (g) first to last event: 1 process of a group/without "
            f"{steady_one.per_second / steady_single.per_second:.2f}x, "
            + ", ".join(
                f"{count} processes/1 of a group {figure.per_second / steady_one.per_second:.2f}x"
                for count, figure in enumerate(steady_more, start=2)
            )
        )
        moved = group.takeover(spanner, kafka)
        print(
            f"  (h) SIGKILL of one of 2 (session timeout {group.SESSION_SECONDS} s) → its shards "
            f"{sorted(moved.shards)} owned by the other {moved.owned_seconds:.1f} s later, first event "
            f"of a token in them {moved.first_event_seconds:.1f} s later"
        )
    finally:
        churning.stop()
    return (
        f"(g) 1 process of a group {one.per_second:,.0f} ev/s, without {single.per_second:,.0f}: "
        f"{one.per_second / single.per_second:.2f}x"
    )


def partitions_part(stack: EmbeddedStack, args: argparse.Namespace) -> str:
    print("producer memory with many partitions")
    one, many = (
        producer.many_partitions(stack.endpoint("kafka"), count, args.seconds) for count in (1, 1_000)
    )
    for found in (one, many):
        print(
            f"  (f) {found['partitions']:5,} partition(s) for {found['seconds']:.0f} s: peak RSS "
            f"{found['peak_rss_mib']:.0f} MiB, {found['events']:,} events acknowledged"
        )
    line = (
        f"(f) 1,000 partitions peak RSS {many['peak_rss_mib']:.0f} MiB, "
        f"{many['peak_rss_mib'] / one['peak_rss_mib']:.2f}x 1 partition; "
        f"target {PARTITIONS_TARGET_RSS_MIB} MiB: "
        f"{'reached' if many['peak_rss_mib'] <= PARTITIONS_TARGET_RSS_MIB else 'not reached'}"
    )
    print(f"  {line}")
    return line


def backfill_part(stack: EmbeddedStack, args: argparse.Namespace) -> str:
    print("backfill")
    figures = producer.backfill_figures(stack, args.backfill_rows)
    print_figures(figures)
    alone, backfill, alone_steady, backfill_steady = figures
    print_bounds("(d)", backfill)
    line = (
        f"(d) backfill {backfill.per_second:,.0f} rows/s, "
        f"{backfill.per_second / alone.per_second:.2f}x the client reading alone; first to last row "
        f"{backfill_steady.per_second / alone_steady.per_second:.2f}x"
    )
    print(f"  {line}")
    return line


def poll_part(stack: EmbeddedStack, args: argparse.Namespace) -> str:
    print("commit-timestamp polling")
    alone, polled = producer.poll_figures(stack, args.backfill_rows)
    print_figures([alone, polled])
    print_bounds("(e)", polled)
    ratio = polled.per_second / alone.per_second
    line = f"(e) poll {polled.per_second:,.0f} rows/s, {ratio:.2f}x the query alone"
    print(f"  {line}")
    return line


def consumer_part(stack: EmbeddedStack, args: argparse.Namespace) -> str:
    print("consumer, Spark local[2] unless said")
    found = consumer.consumer_figures(stack.endpoint("kafka"), stack.endpoint("postgres"), args.changes)
    raw = found.raw_on_executors
    one_cpu = found.changelog_on_one_cpu
    print_figures(
        [
            raw,
            found.raw_in_batches,
            found.raw_to_driver,
            found.idle_worker,
            found.idle_worker_in_batches,
            found.changelog,
            found.changelog_in_batches,
            found.changelog_in_the_jvm,
            found.changelog_in_the_jvm_in_batches,
            *found.replicas,
            found.postgres_loaded_by_driver,
            *found.lakehouse,
            found.changelog_warm,
            *([one_cpu] if one_cpu else []),
            found.changelog_on_one_core,
            found.changelog_on_one_core_in_batches,
            found.wide_raw,
            *found.wide_replicas,
        ]
    )
    print(
        f"  raw read on the executors: {raw.per_second / RAW_TARGET_EVENTS_PER_SECOND:.0%} of the "
        f"{RAW_TARGET_EVENTS_PER_SECOND:,} ev/s target; to the driver: "
        f"{found.raw_to_driver.per_second / raw.per_second:.2f}x the read on the executors"
    )
    batches_raw, batches_changelog = found.raw_in_batches, found.changelog_in_batches
    print(
        f"  in the queries' batches alone (not the targets' figures: each query above also pays its start): "
        f"raw read {batches_raw.per_second / RAW_TARGET_EVENTS_PER_SECOND:.0%} of the raw target, "
        f"changelog {batches_changelog.per_second / CHANGELOG_TARGET_EVENTS_PER_SECOND:.0%} of its target, "
        f"{batches_changelog.per_second / batches_raw.per_second:.2f}x the raw read"
    )
    idle, idle_in_batches = found.idle_worker, found.idle_worker_in_batches
    print(
        f"  changelog: {found.changelog.per_second / idle.per_second:.2f}x the rows handed to idle "
        f"Python workers in the same batches; in the batches alone "
        f"{batches_changelog.per_second / idle_in_batches.per_second:.2f}x (the consumer's own work)"
    )
    jvm, jvm_in_batches = found.changelog_in_the_jvm, found.changelog_in_the_jvm_in_batches
    print(
        f"  changelog: {found.changelog.per_second / jvm.per_second:.2f}x the same events decoded in "
        f"the JVM; in the batches alone {batches_changelog.per_second / jvm_in_batches.per_second:.2f}x"
    )
    for figure, baseline, target in (
        (found.changelog, raw, CHANGELOG_TARGET_EVENTS_PER_SECOND),
        *((replica, raw, REPLICA_TARGET_EVENTS_PER_SECOND) for replica in found.replicas),
        *((replica, raw, REPLICA_TARGET_EVENTS_PER_SECOND) for replica in found.lakehouse),
        *((replica, found.wide_raw, REPLICA_TARGET_EVENTS_PER_SECOND) for replica in found.wide_replicas),
    ):
        print(
            f"  {figure.name.split(' (')[0]}: {figure.per_second / baseline.per_second:.2f}x the "
            f"{baseline.name.split(' (')[0]}, {figure.per_second / target:.0%} of the {target:,} ev/s target"
        )
    for whole, apart in zip(found.replicas[::2], found.replicas[1::2], strict=True):
        print(
            f"  {whole.name.split(' (')[0]}: {whole.per_second / apart.per_second:.2f}x "
            "the same replica without transaction grouping"
        )
    for lakehouse in found.lakehouse:
        print(
            f"  {lakehouse.name.split(' (')[0]}: {lakehouse.per_second / found.replicas[0].per_second:.2f}x "
            "DuckDB's with whole transactions"
        )
    by_tasks, by_driver = found.replicas[2], found.postgres_loaded_by_driver
    print(
        f"  {by_tasks.name.split(' (')[0]}, stage rows loaded by the tasks: "
        f"{by_tasks.per_second / by_driver.per_second:.2f}x loaded by the driver"
    )
    one_core, warm = found.changelog_on_one_core.per_second, found.changelog_warm.per_second
    growth = found.changelog.per_second / one_core
    print(f"  growth: changelog on local[2] {growth:.2f}x the same on local[1] (target 1.6x)")
    print(f"  growth, warm: changelog again on local[2] {warm / one_core:.2f}x the same on local[1]")
    in_batches = found.changelog_in_batches.per_second / found.changelog_on_one_core_in_batches.per_second
    print(
        f"  growth, the queries' batches alone: changelog on local[2] {in_batches:.2f}x the same on local[1]"
    )
    if one_cpu:
        cpus = len(os.sched_getaffinity(0))
        print(f"  growth, warm: the same on {cpus} CPUs {warm / one_cpu.per_second:.2f}x it pinned to one")
    small, large = found.driver_rss_small_batches, found.driver_rss_large_batches
    print(
        f"  driver peak RSS: {small:.0f} MiB with 10,000-event batches, {large:.0f} MiB with 200,000: "
        f"{large / small:.2f}x (target within 1.2x)"
    )
    by_fastavro, compiled = consumer.decoder_figures(args.changes)
    print_figures([by_fastavro, compiled])
    print(f"  decode alone: the compiled reader {compiled.per_second / by_fastavro.per_second:.2f}x fastavro")
    clean, *damaged = consumer.gate_figures(args.changes)
    print_figures([clean, *damaged])
    for figure in damaged:
        print(f"  {figure.name}: {figure.per_second / clean.per_second:.2f}x the clean gate")
    duckdb = found.replicas[0]
    postgres = found.replicas[2]
    return (
        f"raw {raw.per_second:,.0f} ev/s, changelog {found.changelog.per_second:,.0f} "
        f"({found.changelog.per_second / raw.per_second:.2f}x raw), "
        f"replica DuckDB {duckdb.per_second:,.0f} / "
        f"PostgreSQL {postgres.per_second:,.0f} / "
        f"Delta {found.lakehouse[0].per_second:,.0f} ({found.lakehouse[1].per_second:,.0f} in large batches) "
        "(whole transactions)"
    )


def cluster_part(stack: EmbeddedStack, args: argparse.Namespace) -> str:
    """Growth on a Spark standalone cluster: the changelog with two workers against one."""
    print("consumer on a Spark standalone cluster, workers of 1 core each")
    one, one_in_batches, two, two_in_batches = consumer.cluster_figures(stack.endpoint("kafka"), args.changes)
    print_figures([one, one_in_batches, two, two_in_batches])
    growth, in_batches = (
        two.per_second / one.per_second,
        two_in_batches.per_second / one_in_batches.per_second,
    )
    print(
        f"  growth: changelog on 2 workers {growth:.2f}x the same on 1; "
        f"in the batches alone {in_batches:.2f}x"
    )
    cores = os.cpu_count() or 1
    for count, figure in ((1, one), (2, two)):
        assert figure.cpu is not None
        busy = figure.cpu.machine / figure.seconds / cores
        print(f"  changelog on {count} worker(s): the machine's {cores} CPUs {busy:.0%} busy")
    return f"changelog on 2 workers {two.per_second:,.0f} ev/s, on 1 {one.per_second:,.0f}: {growth:.2f}x"


def pipeline_part(stack: EmbeddedStack, args: argparse.Namespace) -> str:
    """Commit → replica latency of the whole pipeline under the demo's workload, into DuckDB and
    into Delta; the producer's own commit → ack latency, (c) above, is its baseline (what the
    consumer adds is the rest)."""
    print(f"pipeline: the demo's workload at {DEFAULT_TRANSFERS_PER_SECOND} transfers/s")
    found = []
    # Delta first: the process has one JVM, and Delta's jars are given when it starts.
    for replica in ("delta", "duckdb"):
        workdir = Path(tempfile.mkdtemp(prefix="spanner-cdc-bench-"))
        try:
            run = run_bank(stack, workdir, args.seconds, DEFAULT_TRANSFERS_PER_SECOND, replica)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        latencies = run.watch.latencies
        p50, p99 = percentile(latencies, 0.5) * 1000, percentile(latencies, 0.99) * 1000
        print(
            f"  {replica}: commit → replica for {args.seconds:.0f} s: p50 {p50:,.0f} ms, "
            f"p99 {p99:,.0f} ms over {len(latencies)} changes; p99/target {PIPELINE_TARGET_P99_MS:,} ms "
            f"{p99 / PIPELINE_TARGET_P99_MS:.2f}x"
        )
        found.append(f"{replica} p50 {p50:,.0f} ms, p99 {p99:,.0f} ms")
    return f"commit → replica {'; '.join(found)} (target p99 {PIPELINE_TARGET_P99_MS:,} ms)"


def peer_part(stack: EmbeddedStack, args: argparse.Namespace) -> str:
    """The producer beside Debezium's Spanner connector: (a) a committed backlog, (b) latency."""
    print("peer: Debezium's Spanner connector beside the producer, same emulator and broker")
    found = peer.peer_figures(stack, args.peer_rows, PEER_RATE, args.seconds)
    print_figures(
        [found.ours_backlog, found.debezium_backlog, found.ours_backlog_steady, found.debezium_backlog_steady]
    )
    whole = found.ours_backlog.per_second / found.debezium_backlog.per_second
    steady = found.ours_backlog_steady.per_second / found.debezium_backlog_steady.per_second
    print(f"  (a) ours/Debezium {whole:.2f}x from each process's start, {steady:.2f}x first to last change")
    for name, p50, p99, count in found.latencies:
        print(
            f"  (b) {name}: commit → read_committed reader at {PEER_RATE:.0f} tx/s for {args.seconds:.0f} s: "
            f"p50 {p50:,.0f} ms, p99 {p99:,.0f} ms over {count} changes"
        )
    (_, _, ours_p99, _), (_, _, dbz_p99, _) = found.latencies
    return (
        f"(a) backlog ours {found.ours_backlog.per_second:,.0f} ev/s, Debezium "
        f"{found.debezium_backlog.per_second:,.0f}: {whole:.2f}x; (b) p99 ours {ours_p99:,.0f} ms, "
        f"Debezium {dbz_p99:,.0f} ms"
    )


def producer_part(stack: EmbeddedStack, args: argparse.Namespace) -> str:
    print("producer")
    figures = producer.pipeline_figures(stack.endpoint("kafka"), args.events)
    print_figures(figures)
    fastavro_alone, encoder_alone, kafka_alone, pipeline, cold, as_json = figures
    print(
        f"  encoder alone/fastavro alone {encoder_alone.per_second / fastavro_alone.per_second:.2f}x, "
        f"pipeline/fastavro alone {pipeline.per_second / fastavro_alone.per_second:.2f}x, "
        f"pipeline/confluent-kafka alone {pipeline.per_second / kafka_alone.per_second:.2f}x, "
        f"pipeline/target {PRODUCER_TARGET_EVENTS_PER_SECOND:,} ev/s "
        f"{pipeline.per_second / PRODUCER_TARGET_EVENTS_PER_SECOND:.0%}; "
        f"JSON/Avro pipeline {as_json.per_second / pipeline.per_second:.2f}x; "
        f"from a cold start/started {cold.per_second / pipeline.per_second:.2f}x"
    )
    print_bounds("(a)", pipeline)
    (alone, undecoded), backlog, (alone_span, backlog_span), runs = producer.emulator_figures(
        stack,
        args.rows,
        rates=args.rates,
        heartbeats_ms=args.heartbeats_ms,
        seconds=args.seconds,
        release_orders=args.release_orders,
    )
    print_figures([alone, undecoded, backlog, alone_span, backlog_span])
    print(
        f"  (b) producer/client alone {backlog.per_second / alone.per_second:.2f}x (target 0.8x); "
        f"producer/client alone reading rows as the producer does "
        f"{backlog.per_second / undecoded.per_second:.2f}x, first to last row "
        f"{backlog_span.per_second / alone_span.per_second:.2f}x"
    )
    print_bounds("(b)", backlog)
    for run in runs:
        p50, p99 = percentile(run.samples, 0.5) * 1000, percentile(run.samples, 0.99) * 1000
        verdict = "reached" if p99 <= LATENCY_TARGET_P99_MS else "not reached"
        print(
            f"  (c) commit → ack, release order {run.release_order}, heartbeat {run.heartbeat_ms:,} ms, "
            f"at {run.rate:,.0f} tx/s "
            f"({run.achieved_rate:,.0f} committed/s) for "
            f"{args.seconds:.0f} s: p50 {p50:.0f} ms, p99 {p99:.0f} ms over {len(run.samples)} events "
            f"(target p99 {LATENCY_TARGET_P99_MS:,} ms: {verdict})"
        )
    return (
        f"(a) {pipeline.per_second:,.0f} ev/s "
        f"({pipeline.per_second / fastavro_alone.per_second:.2f}x fastavro alone); "
        f"(b) {backlog.per_second:,.0f} ev/s ({backlog.per_second / alone.per_second:.2f}x the client alone, "
        f"{backlog.per_second / undecoded.per_second:.2f}x it reading rows as the producer does)"
    )


Part = Callable[[EmbeddedStack, argparse.Namespace], str]
PART_RUNS: dict[str, Part] = {
    "producer": producer_part,
    "group": group_part,
    "partitions": partitions_part,
    "backfill": backfill_part,
    "poll": poll_part,
    "consumer": consumer_part,
    "cluster": cluster_part,
    "pipeline": pipeline_part,
    "peer": peer_part,
}


if __name__ == "__main__":
    main()
