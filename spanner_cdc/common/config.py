"""Options declared once, read from the command line, the environment and a TOML file.

Precedence: command line > ``SPANNER_CDC_<NAME>`` > the TOML file's ``[<command>]`` table >
built-in default. Every source goes through the option's own parser, so a bad value is the
same one-line error wherever it came from, naming where it came from.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from spanner_cdc.common.logs import LEVELS
from spanner_cdc.errors import UsageError

ENV_PREFIX = "SPANNER_CDC_"


class ConfigError(UsageError):
    """A configuration value that cannot be used; the message names the option and source."""


@dataclass(frozen=True)
class Option:
    """One option. ``parse`` turns text into the value and raises ValueError when it can't."""

    name: str
    help: str
    parse: Callable[[str], Any] = str
    default: Any = None
    required: bool = False
    repeated: bool = False
    metavar: str | None = None
    #: What separates entries of a repeated option given as one string (environment, a TOML
    #: string) or in one command-line value.
    separator: str = ","
    #: Values may hold credentials: an error shows at most the key of a ``KEY=VALUE`` entry.
    sensitive: bool = False
    #: Other spellings users bring from other tools (``--bootstrap-server``).
    aliases: tuple[str, ...] = ()
    #: The heading ``--help`` lists it under (:func:`on_topic`); empty: the command's own.
    topic: str = ""

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def is_switch(self) -> bool:
        """A true/false option: ``--name`` alone means true, ``--no-name`` false."""
        return self.parse is boolean

    @property
    def flags(self) -> list[str]:
        """Every command-line spelling, the main one first."""
        negative = [f"--no-{self.name}"] if self.is_switch else []
        return [f"--{self.name}", *(f"--{alias}" for alias in self.aliases), *negative]

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.dest.upper()


def on_topic(topic: str, *options: Option) -> tuple[Option, ...]:
    """``options`` listed under ``topic`` in ``--help``."""
    return tuple(replace(option, topic=topic) for option in options)


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    """Declare ``options`` on ``parser``, under a heading per topic (in the order topics first
    appear); values are resolved later by :func:`resolve`. A choice shows its values, a default
    its value."""
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"TOML file with a [{parser.prog.split()[-1]}] table of these options (env {ENV_PREFIX}CONFIG)",
    )
    groups: dict[str, Any] = {}
    for option in options:
        group = groups.get(option.topic)
        if group is None:
            group = groups[option.topic] = parser.add_argument_group(option.topic) if option.topic else parser
        extra = f"; env {option.env_var}"
        if option.default is not None:
            extra += f"; default {default_text(option.default)}"
        if option.required:
            extra += "; required"
        main, *aliases = [flag for flag in option.flags if not flag.startswith("--no-")]
        if option.is_switch:
            group.add_argument(
                main, *aliases, dest=option.dest, nargs="?", const="true", default=None,
                metavar="true|false", help=option.help + extra,
            )  # fmt: skip
            group.add_argument(
                f"--no-{option.name}", dest=option.dest, action="store_const", const="false",
                help=f"the same as {main} false",
            )  # fmt: skip
            continue
        allowed = option.parse.allowed if isinstance(option.parse, Choice) else None
        group.add_argument(
            main,
            *aliases,
            dest=option.dest,
            action="append" if option.repeated else "store",
            default=None,
            metavar=option.metavar or ("{" + ",".join(allowed) + "}" if allowed else None),
            help=option.help + extra,
        )


def default_text(default: Any) -> str:
    """A default as a user writes it: a list comma-separated, true/false in lower case."""
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, list | tuple):
        return ",".join(map(str, default))
    return str(default)


def resolve(args: argparse.Namespace, options: Sequence[Option], section: str) -> dict[str, Any]:
    """Final option values by precedence; raises ConfigError naming the option and source."""
    config_path = args.config or (
        Path(os.environ[ENV_PREFIX + "CONFIG"]) if ENV_PREFIX + "CONFIG" in os.environ else None
    )
    table = _read_toml(config_path, section) if config_path else {}
    known = {option.dest for option in options} | {option.name for option in options}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{config_path}: unknown option(s) in [{section}]: {', '.join(unknown)}")
    values: dict[str, Any] = {}
    for option in options:
        raw, source = _raw_value(args, option, table)
        if raw is None:
            if option.required:
                raise ConfigError(f"--{option.name} is required (or set {option.env_var})")
            if option.repeated:
                values[option.dest] = list(option.default or [])
            elif isinstance(option.default, str):
                values[option.dest] = _parse(option, option.default, "default")
            else:
                values[option.dest] = option.default
            continue
        values[option.dest] = _parse(option, raw, source)
    return values


def _raw_value(args: argparse.Namespace, option: Option, table: Mapping[str, Any]) -> tuple[Any, str]:
    given = getattr(args, option.dest)
    if given is not None:
        return given, f"--{option.name}"
    if option.env_var in os.environ:
        return os.environ[option.env_var], option.env_var
    for key in (option.name, option.dest):
        if key in table:
            return table[key], f"config key {key}"
    return None, "default"


def _parse(option: Option, raw: Any, source: str) -> Any:
    items: list[Any]
    if option.repeated:
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list):
            raise ConfigError(f"{source}: expected a list, got {_shown(option, str(raw))}")
        items = [part.strip() for item in raw for part in str(item).split(option.separator) if part.strip()]
    else:
        items = [raw]
    parsed = []
    for item in items:
        text = str(item).lower() if isinstance(item, bool) else str(item)
        try:
            parsed.append(option.parse(text))
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{source}: invalid value {_shown(option, text)}: {exc}") from None
    return parsed if option.repeated else parsed[0]


def _shown(option: Option, text: str) -> str:
    """``text`` as an error may show it: a sensitive value is reduced to its key, if any."""
    if not option.sensitive:
        return repr(text)
    key, sep, _ = text.partition("=")
    return f"'{key.strip()}=<hidden>'" if sep else "<hidden>"


def _read_toml(path: Path, section: str) -> dict[str, Any]:
    try:
        document = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    table = document.get(section, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [{section}] must be a table")
    return table


# --- value parsers shared by commands -------------------------------------------------------


def integer_in(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}")
        return value

    return parse


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError("must be above 0")
    return value


def boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError("expected true or false")


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError("expected KEY=VALUE")
    return key.strip(), value.strip()


def settings_option(name: str, what: str, detail: str = "") -> Option:
    """A repeatable ``KEY=VALUE`` option passed through to a client library (librdkafka, Spark).

    Values may contain commas (lists, JAAS configurations) and credentials: each command-line
    flag is one entry, and in the environment or a TOML string entries are one per line; errors
    never show a value.
    """
    return Option(
        name,
        f"extra {what} setting KEY=VALUE (repeatable; in the environment one per line){detail}",
        key_value,
        repeated=True,
        metavar="KEY=VALUE",
        separator="\n",
        sensitive=True,
    )


@dataclass(frozen=True)
class Choice:
    """Parses one of ``allowed``; ``--help`` shows them."""

    allowed: tuple[str, ...]

    def __call__(self, text: str) -> str:
        if text not in self.allowed:
            raise ValueError(f"choose from {', '.join(self.allowed)}")
        return text


def choice(*allowed: str) -> Choice:
    return Choice(allowed)


#: How long services may take to answer a command's first requests (``--connect-timeout-seconds``).
CONNECT_TIMEOUT_SECONDS = 30.0
#: Options every long-running command has.
SERVICE_OPTIONS = (
    Option(
        "connect-timeout-seconds",
        "how long Spanner and Kafka may take to answer a command's first requests before it stops "
        "with one line (raise it where services start slowly)",
        positive_float,
        default=CONNECT_TIMEOUT_SECONDS,
    ),
    Option(
        "metrics-port",
        "HTTP port of Prometheus /metrics and the status page at / (0: off)",
        integer_in(0, 65535),
        default=0,
    ),
    Option(
        "metrics-host",
        "address the metrics port listens on (0.0.0.0: every interface, e.g. in a container)",
        default="127.0.0.1",
    ),
    Option("log-format", "text or json", choice("text", "json"), default="text"),
    Option(
        "log-level",
        "debug, info, warning or error; debug adds detail lines (the producer: each change Spanner returned)",
        choice(*LEVELS),
        default="info",
    ),
)
