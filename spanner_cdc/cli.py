"""The ``spanner-cdc`` command line.

User mistakes and unavailable services end in one clear line on stderr and a non-zero exit
code, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from spanner_cdc.common.config import ConfigError, add_options, integer_in, resolve
from spanner_cdc.common.logs import configure as configure_logging
from spanner_cdc.consumer.config import CONSUME_OPTIONS, ConsumerConfig
from spanner_cdc.errors import EXIT_FAILURE, EXIT_USAGE, SpannerCdcError
from spanner_cdc.producer.config import PRODUCE_OPTIONS, ProducerConfig
from spanner_cdc.stack import SERVICES, EmbeddedStack, ServiceError, stop_on_signals

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
        default=20,
        help="transfers per second, at most (default 20)",
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
            if args.command == "consume":
                return _run_consume(args)
            if args.command == "demo-database":
                return _run_demo_database(args)
            return _run_demo(args)
    except SpannerCdcError as exc:
        where = f"spanner-cdc {args.command}" if exc.exit_code == EXIT_USAGE else "spanner-cdc"
        print(f"{where}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def _run_produce(args: argparse.Namespace) -> int:
    from spanner_cdc.producer.main import produce

    config = ProducerConfig.from_options(resolve(args, PRODUCE_OPTIONS, "produce"))
    configure_logging(config.log_format, config.log_level)
    asyncio.run(produce(config))
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
