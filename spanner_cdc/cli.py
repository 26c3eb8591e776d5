"""The ``spanner-cdc`` command line.

User mistakes and unavailable services end in one clear line on stderr and a non-zero exit
code, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import logging
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from spanner_cdc.common.config import ConfigError, add_options, integer_in, resolve
from spanner_cdc.common.logs import configure as configure_logging
from spanner_cdc.consumer.config import CONSUME_OPTIONS, ConsumerConfig, duckdb_file, require_postgres_dsn
from spanner_cdc.demo import DEFAULT_TRANSFERS_PER_SECOND
from spanner_cdc.errors import EXIT_FAILURE, EXIT_USAGE, SpannerCdcError
from spanner_cdc.producer.config import PRODUCE_OPTIONS, ProducerConfig
from spanner_cdc.producer.poll.config import POLL_LIMITS, POLL_OPTIONS, PollConfig
from spanner_cdc.stack import SERVICES, EmbeddedStack, ServiceError, stop_on_signals

#: The consumer's own declarations of where the replica is (stream, changes, replica status).
REPLICA_OPTIONS = tuple(
    option
    for option in CONSUME_OPTIONS
    if option.name in ("replica", "output-dir", "local-dir", "postgres-dsn", "spark-conf")
)
#: The producer's own declarations of where the database is.
DEMO_DATABASE_OPTIONS = tuple(
    option
    for option in PRODUCE_OPTIONS
    if option.name in ("project", "instance", "database", "emulator-host")
)
STACK_ENV_NAMES = {
    "spanner": "SPANNER_EMULATOR_HOST",
    "kafka": "SPANNER_CDC_KAFKA_BOOTSTRAP",
    "postgres": "SPANNER_CDC_POSTGRES_DSN",
}


def _services(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = sorted(set(names) - set(SERVICES))
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"choose from {','.join(SERVICES)}; got {text!r}")
    return names


def _argument(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """A shared option parser as an argparse type, keeping its error message."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc}, got {text!r}") from None

    return convert


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spanner-cdc",
        description="Change data capture from Cloud Spanner change streams to Kafka and Spark sinks.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {importlib.metadata.version('spanner-cdc')}"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    stack = commands.add_parser(
        "stack",
        help="start, stop or inspect the embedded stack (emulator, broker, PostgreSQL)",
        description="The embedded stack on free local ports. Each service resolves to an address "
        "from the environment, a local binary, or a container when a Docker engine answers.",
    )
    stack_commands = stack.add_subparsers(dest="stack_command", required=True, metavar="ACTION")
    stack_dir = argparse.ArgumentParser(add_help=False)
    stack_dir.add_argument(
        "--dir",
        type=Path,
        default=Path(os.environ.get("SPANNER_CDC_STACK_DIR", ".stack")),
        help="work directory for data, logs and state (env SPANNER_CDC_STACK_DIR; default .stack)",
    )
    up = stack_commands.add_parser(
        "up", parents=[stack_dir], help="start the services and leave them running"
    )
    up.add_argument(
        "--services",
        type=_services,
        default=SERVICES,
        help=f"comma-separated subset of {','.join(SERVICES)} (default: all)",
    )
    up.add_argument(
        "--churn-seconds",
        type=_argument(integer_in(1, 3600)),
        default=None,
        help="emulator partition tokens live N to 2N seconds instead of 20 to 40",
    )
    stack_commands.add_parser("down", parents=[stack_dir], help="stop the services started by 'up'")
    stack_commands.add_parser("status", parents=[stack_dir], help="probe the services started by 'up'")

    produce = commands.add_parser(
        "produce",
        help="read a Spanner change stream and publish its changes to Kafka",
        description="Reads every partition of a change stream (following splits and merges), publishes "
        "one Datastream-shaped Avro event per row change to {prefix}.{table}, and checkpoints only what "
        "Kafka acknowledged. Every option can also be set as an environment variable or in a TOML file.",
    )
    add_options(produce, PRODUCE_OPTIONS)

    poll = commands.add_parser(
        "poll",
        help="publish the changes of a table without a change stream, by its commit-timestamp column",
        description="Every --interval seconds, reads the rows whose commit-timestamp column is at or after "
        "the last one published (at an exact read timestamp, the boundary read again and its keys "
        "deduplicated, since commit timestamps are not unique) and publishes each whole row as a "
        "Datastream-shaped event (read_method spanner-commit-timestamp-poll) to {prefix}.{table}, with "
        f"watermark records and a position only for what Kafka acknowledged. {POLL_LIMITS} Every option "
        "can also be set as an environment variable or in a TOML file.",
    )
    add_options(poll, POLL_OPTIONS)

    consume = commands.add_parser(
        "consume",
        help="read the producer's topics with Spark and write the changelog and replica",
        description="A Spark Structured Streaming job: decodes every event (undecodable messages go to "
        "quarantine with the reason), drops duplicates by uuid, orders each key's changes by sort_keys, "
        "and writes an append-only Parquet changelog and a merged replica (DuckDB or PostgreSQL), "
        "exactly once across restarts. Every option can also be set as an environment variable or in a "
        "TOML file.",
    )
    add_options(consume, CONSUME_OPTIONS)

    demo_database = commands.add_parser(
        "demo-database",
        help="create the demo's bank database on a Spanner emulator (nothing if it exists)",
        description="Creates the emulator instance if needed and the bank database of 'spanner-cdc demo' "
        "(Accounts, Transfers and a NEW_ROW_AND_OLD_VALUES change stream over both) unless it exists. "
        "For the docker/ compose stack and for trying the producer by hand.",
    )
    add_options(demo_database, DEMO_DATABASE_OPTIONS)
    _add_stream_commands(commands)

    demo = commands.add_parser(
        "demo",
        help="run the whole pipeline on the embedded stack and verify the result",
        description="Starts the embedded stack, creates a bank database with a change stream, moves money "
        "between accounts for a while, runs the producer and the consumer, and checks that the replica "
        "equals Spanner row for row, that the changelog has every change and that no money appeared or "
        "vanished. Exit 1 if a check fails.",
    )
    demo.add_argument(
        "--seconds", type=_argument(integer_in(1, 3600)), default=20, help="workload length (default 20)"
    )
    demo.add_argument(
        "--rate",
        type=_argument(integer_in(1, 1000)),
        default=DEFAULT_TRANSFERS_PER_SECOND,
        help=f"transfers per second, at most (default {DEFAULT_TRANSFERS_PER_SECOND})",
    )
    demo.add_argument(
        "--replica", choices=("duckdb", "postgres"), default="duckdb", help="replica sink (default duckdb)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with stop_on_signals():
            if args.command == "stack":
                return _run_stack(args)
            if args.command == "produce":
                return _run_produce(args)
            if args.command == "poll":
                return _run_poll(args)
            if args.command == "consume":
                return _run_consume(args)
            if args.command == "demo-database":
                return _run_demo_database(args)
            if args.command in ("stream", "changes", "replica"):
                return _run_on_replica(args)
            return _run_demo(args)
    except SpannerCdcError as exc:
        where = f"spanner-cdc {args.command}" if exc.exit_code == EXIT_USAGE else "spanner-cdc"
        print(f"{where}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def _add_stream_commands(commands: Any) -> None:
    """``stream …``, ``changes`` and ``replica status``: they work while ``consume`` runs."""
    from spanner_cdc.consumer.streams.modes import DEFAULT_MODE, MODES
    from spanner_cdc.consumer.streams.output import FORMATS

    replica = argparse.ArgumentParser(add_help=False, prog="consume")
    add_options(replica, REPLICA_OPTIONS)
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument(
        "--format", choices=FORMATS, default="table", help="table (default), json lines or csv"
    )
    mode = argparse.ArgumentParser(add_help=False)
    mode.add_argument("--mode", choices=MODES, default=DEFAULT_MODE, help=f"default {DEFAULT_MODE}")

    stream = commands.add_parser(
        "stream",
        help="Snowflake/Databend-style streams over the replica: what changed in a table since last consumed",
        description="A stream remembers an offset (a consistent cut of the replica) on one table. Reading "
        "shows the change since then and moves nothing; consuming inserts it into a table and moves the "
        "offset in the same transaction. Works while 'spanner-cdc consume' runs.",
    )
    verbs = stream.add_subparsers(dest="stream_command", required=True, metavar="ACTION")
    create = verbs.add_parser(
        "create", parents=[replica, mode], help="a stream whose offset is the current cut"
    )
    create.add_argument("name")
    create.add_argument("--on", required=True, metavar="TABLE", help="the Spanner table")
    create.add_argument("--comment", default="")
    verbs.add_parser("show", parents=[replica, output], help="every stream, its offset and staleness")
    read = verbs.add_parser("read", parents=[replica, output], help="the stream's rows; consumes nothing")
    read.add_argument("name")
    consume = verbs.add_parser(
        "consume",
        parents=[replica],
        help="insert the stream's rows into a table and move the offset, at once",
    )
    consume.add_argument("name")
    consume.add_argument("--into", required=True, metavar="TARGET", help="created when missing")
    consume.add_argument("--columns", default="", help="comma-separated (default: the table's columns)")
    has_data = verbs.add_parser(
        "has-data", parents=[replica], help="true or false; an empty stream's offset moves to the current cut"
    )
    has_data.add_argument("name")
    drop = verbs.add_parser("drop", parents=[replica], help="forget the stream")
    drop.add_argument("name")

    changes = commands.add_parser(
        "changes",
        parents=[replica, output, mode],
        help="a table's change between two points, without a stream (consumes nothing)",
        description="The change of a table after a start point up to an end (default: the replica's "
        "current cut), as a stream would show it. Times are RFC 3339; a time between two of the "
        "replica's cuts reads as the older cut.",
    )
    changes.add_argument("--table", required=True)
    start = changes.add_mutually_exclusive_group(required=True)
    start.add_argument("--at", metavar="TS", help="start from the state at TS")
    start.add_argument("--before", metavar="TS", help="start from the state just before TS")
    changes.add_argument("--end", metavar="TS", help="end at the state at TS (default: now)")

    replica_command = commands.add_parser("replica", help="the replica's consistent cut and rows per table")
    replica_verbs = replica_command.add_subparsers(dest="replica_command", required=True, metavar="ACTION")
    replica_verbs.add_parser(
        "status", parents=[replica, output], help="the consistent cut (RFC 3339) and rows per table"
    )


def _run_on_replica(args: argparse.Namespace) -> int:
    from spanner_cdc.consumer.sinks.replica.backends import open_backend
    from spanner_cdc.consumer.streams.api import StreamReplica
    from spanner_cdc.consumer.streams.output import write_rows
    from spanner_cdc.schemas.timestamps import parse_timestamp_micros

    values = resolve(args, REPLICA_OPTIONS, "consume")
    if values["replica"] == "delta":
        return _run_on_lakehouse(args, values)
    require_postgres_dsn(values["replica"], values["postgres_dsn"])
    replica = StreamReplica(
        open_backend(
            values["replica"],
            duckdb_file(values["output_dir"], values["local_dir"]),
            values["postgres_dsn"],
        )
    )
    try:
        if args.command == "replica":
            status = replica.status()
            cut = status.cut
            write_rows(
                ["consistent_cut", "table", "replica_table", "rows", "renamed_columns", "stopped"],
                [
                    (cut, t.source, t.replica_table, t.rows, t.renamed_columns, t.stopped)
                    for t in status.tables
                ]
                or [(cut, None, None, None, None, None)],
                args.format,
            )
            return 0
        if args.command == "changes":

            def micros(text: str) -> int:
                try:
                    return parse_timestamp_micros(text)
                except ValueError:
                    raise ConfigError(f"not an RFC 3339 timestamp: {text!r}") from None

            start = micros(args.at) if args.at else micros(args.before) - 1
            selected = replica.changes(args.table, start, micros(args.end) if args.end else None, args.mode)
            write_rows(selected.names, selected.rows, args.format)
            return 0
        return _run_stream(args, replica)
    finally:
        replica.close()


def _run_on_lakehouse(args: argparse.Namespace, values: dict[str, Any]) -> int:
    """``replica status`` of a Delta replica, from its ``_cut.json``; streams and changes read
    the SQL replicas' row history."""
    from spanner_cdc.consumer.locations import Location, hadoop_settings
    from spanner_cdc.consumer.sinks.lakehouse.merge import LAKEHOUSE_DIR, LakehouseCut
    from spanner_cdc.consumer.streams.output import write_rows

    if args.command != "replica":
        raise ConfigError(
            f"{args.command} reads the row history of a DuckDB or PostgreSQL replica (--replica duckdb or "
            "postgres); a Delta replica's changes are its Change Data Feed (docs/consumer.md)"
        )
    output = Location.parse(values["output_dir"], hadoop_settings(dict(values["spark_conf"])))
    status = LakehouseCut.read(output / LAKEHOUSE_DIR)
    names = sorted(status.tables.keys() | status.stopped.keys())
    write_rows(
        ["consistent_cut", "table", "replica_table", "rows", "renamed_columns", "stopped"],
        [(status.cut, t, status.tables.get(t), None, {}, status.stopped.get(t)) for t in names]
        or [(status.cut, None, None, None, None, None)],
        args.format,
    )
    return 0


def _run_stream(args: argparse.Namespace, replica: Any) -> int:
    from spanner_cdc.consumer.streams.output import write_rows
    from spanner_cdc.schemas.timestamps import datetime_from_micros

    verb = args.stream_command
    if verb == "create":
        created = replica.create(args.name, args.on, args.mode, args.comment)
        print(f"created stream {created.name} on {created.table_on} ({created.mode})")
    elif verb == "show":
        states = replica.show()
        names = [
            "created_on",
            "name",
            "table_on",
            "comment",
            "mode",
            "offset",
            "stale",
            "stale_after",
            "invalid_reason",
        ]
        rows = [
            (s.stream.created_on, s.stream.name, s.stream.table_on, s.stream.comment, s.stream.mode,
             datetime_from_micros(s.stream.offset_micros), s.stale, s.stale_after, s.invalid_reason)
            for s in states
        ]  # fmt: skip
        write_rows(names, rows, args.format)
    elif verb == "read":
        selected = replica.read(args.name)
        write_rows(selected.names, selected.rows, args.format)
    elif verb == "consume":
        columns = [c.strip() for c in args.columns.split(",") if c.strip()]
        count = replica.consume(args.name, args.into, columns)
        print(f"consumed {count} row(s) of stream {args.name} into {args.into}")
    elif verb == "has-data":
        print("true" if replica.has_data(args.name) else "false")
    else:
        replica.drop(args.name)
        print(f"dropped stream {args.name}")
    return 0


def _run_produce(args: argparse.Namespace) -> int:
    from spanner_cdc.producer.main import produce

    config = ProducerConfig.from_options(resolve(args, PRODUCE_OPTIONS, "produce"))
    configure_logging(config.log_format, config.log_level)
    asyncio.run(produce(config))
    return 0


def _run_poll(args: argparse.Namespace) -> int:
    from spanner_cdc.producer.poll.main import poll

    config = PollConfig.from_options(resolve(args, POLL_OPTIONS, "poll"))
    configure_logging(config.log_format, config.log_level)
    asyncio.run(poll(config))
    return 0


def _run_consume(args: argparse.Namespace) -> int:
    from spanner_cdc.consumer.main import consume

    config = ConsumerConfig.from_options(resolve(args, CONSUME_OPTIONS, "consume"))
    configure_logging(config.log_format, config.log_level)
    consume(config)
    return 0


def _run_demo_database(args: argparse.Namespace) -> int:
    from google.api_core.exceptions import GoogleAPIError

    from spanner_cdc.common.spanner_client import emulator_host
    from spanner_cdc.demo.bank import ensure_demo_database
    from spanner_cdc.producer.errors import SpannerSetupError

    values = resolve(args, DEMO_DATABASE_OPTIONS, "demo-database")
    host = emulator_host(values["emulator_host"])
    if not host:
        raise ConfigError("--emulator-host is required: the demo database is made on an emulator")
    try:
        created = ensure_demo_database(host, values["project"], values["instance"], values["database"])
    except GoogleAPIError as exc:
        raise SpannerSetupError(f"cannot create the demo database on {host}: {exc}") from None
    print(f"{'created' if created else 'exists:'} database {values['database']} on {host}")
    return 0


def _run_stack(args: argparse.Namespace) -> int:
    workdir: Path = args.dir
    if args.stack_command == "up":
        if (workdir / "state.json").exists():
            raise ServiceError(f"a stack is already up in {workdir}; run 'spanner-cdc stack down' first")
        stack = EmbeddedStack.start(workdir, args.services, args.churn_seconds)
        stack.save()
        for name, handle in stack.services.items():
            if handle.env_var:  # the caller's shell has it already; printing it would show secrets
                print(f"# {name}: {handle.env_var} from the environment ({handle.shown_endpoint})")
            else:
                print(f"export {STACK_ENV_NAMES[name]}={handle.endpoint}  # {name} ({handle.source})")
        return 0
    stack = EmbeddedStack.load(workdir)
    if args.stack_command == "down":
        names = ", ".join(stack.services)
        stack.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        print(f"stopped {names} in {workdir}")
        return 0
    statuses = stack.status()
    for name, status in statuses.items():
        print(f"{name:9} {stack.services[name].shown_endpoint:45} {status}")
    return 0 if all(s == "ready" for s in statuses.values()) else EXIT_FAILURE


def _run_demo(args: argparse.Namespace) -> int:
    from spanner_cdc.demo.run import run_demo

    configure_logging("text", "warning")
    logging.getLogger("spanner_cdc.common.progress").setLevel(logging.INFO)  # the live line, off a terminal
    return run_demo(args.seconds, args.rate, args.replica)


if __name__ == "__main__":
    sys.exit(main())
