"""Documentation and deployment files that must stay in step with the code.

docs/reference.md's option reference must be what the option declarations generate and name
exactly the options ``--help`` shows; docs/design.md's tree of each service must list exactly
its modules; docker/compose.yml must be valid for Docker Compose and
set only variables the services read.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spanner_cdc.reference import COMMANDS, reference

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker" / "compose.yml"
OPTION = re.compile(r"--[a-z][a-z0-9-]+")


def test_the_docs_hold_the_generated_option_reference() -> None:
    assert reference() in (ROOT / "docs" / "reference.md").read_text(), (
        "docs/reference.md's option reference is stale: paste the output of python -m spanner_cdc.reference"
    )


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_reference_names_exactly_the_options_of_help(command: str) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "spanner_cdc.cli", command, "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "400", "PATH": ""},
    ).stdout
    in_help = set(OPTION.findall(shown.split("options:", 1)[1])) - {"--help", "--config"}
    section = reference().split(f"### `spanner-cdc {command}`", 1)[1].split("### ", 1)[0]
    first_cells = re.findall(r"^\| (`--[^|]*) \|", section, re.MULTILINE)
    in_reference = {flag for cell in first_cells for flag in re.findall(r"`(--[a-z0-9-]+)`", cell)}
    assert in_help == in_reference


def _help(*command: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "spanner_cdc.cli", *command],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "400", "PATH": ""},
    ).stdout


def test_help_lists_options_under_their_topics_with_choices_and_defaults() -> None:
    shown = _help("consume", "--help")
    for topic in ("Kafka", "sinks", "micro-batches", "Spark", "timeouts, metrics and logs"):
        assert f"\n{topic}:\n" in shown, topic
    sinks = shown.split("\nsinks:\n", 1)[1].split("\nmicro-batches:\n", 1)[0]
    assert "--replica {duckdb,postgres,delta}" in sinks
    assert "default duckdb" in shown and "default changelog,replica" in shown and "default true" in shown


def test_version_is_the_installed_package_s() -> None:
    assert _help("--version").strip() == f"spanner-cdc {importlib.metadata.version('spanner-cdc')}"


def compose() -> list[str]:
    """The Compose v2 plugin if the docker client has it, else the standalone docker-compose."""
    if (
        shutil.which("docker")
        and subprocess.run(["docker", "compose", "version"], check=False, capture_output=True).returncode == 0
    ):
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.fail("no Docker Compose: scripts/system-deps.sh installs docker-compose")


@pytest.mark.parametrize("service", ["producer", "consumer"])
def test_the_design_s_tree_lists_exactly_the_service_s_modules(service: str) -> None:
    text = (ROOT / "docs" / "design.md").read_text()
    block = text.split(f"spanner_cdc/{service}/ ", 1)[1].split("```", 1)[0]
    listed = {line.split()[0] for line in block.splitlines() if line.strip().split(" ", 1)[0].endswith(".py")}
    package = ROOT / "spanner_cdc" / service
    modules = {str(p.relative_to(package)) for p in package.rglob("*.py") if p.name != "__init__.py"}
    assert listed == modules, (
        f"docs/design.md's tree of {service}: missing {modules - listed}, stale {listed - modules}"
    )


def test_the_compose_stack_is_valid_and_names_every_service() -> None:
    result = subprocess.run(
        [*compose(), "-f", str(COMPOSE_FILE), "config", "--services"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert set(result.stdout.split()) == {
        "spanner",
        "spanner-setup",
        "kafka",
        "postgres",
        "producer",
        "consumer",
    }


def test_the_compose_stack_sets_only_variables_the_services_read() -> None:
    known = {option.env_var for options in COMMANDS.values() for option in options}
    used = set(re.findall(r"^\s+(SPANNER_CDC_[A-Z_]+):", COMPOSE_FILE.read_text(), re.MULTILINE))
    assert used and used <= known, f"unknown settings: {sorted(used - known)}"


DOCKERFILES = sorted((ROOT / "docker").glob("*.Dockerfile"))


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(instruction, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(maxsplit=1)[0].upper(), line.split(maxsplit=1)[1]) for line in lines]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_dockerfile_steps_name_what_the_repository_has(dockerfile: Path) -> None:
    """What a Docker host would find out only when it builds: every COPY source exists (the
    build context is the repository, as compose.yml says), every extra pip installs is declared,
    and the command is one the CLI has."""
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    steps = instructions(dockerfile)
    copies = [args.split()[:-1] for name, args in steps if name == "COPY"]
    assert copies, "no COPY step"
    for sources in copies:
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
    installed = [m for name, args in steps if name == "RUN" for m in re.findall(r"'\.\[([a-z,]+)\]'", args)]
    assert installed, "the image does not pip install the project"
    assert {extra for group in installed for extra in group.split(",")} <= extras
    (command,) = [json.loads(args) for name, args in steps if name == "CMD"]
    assert command[0] == "spanner-cdc" and command[1] in COMMANDS


def test_compose_builds_only_dockerfiles_that_exist() -> None:
    named = re.findall(r"dockerfile: (docker/[\w.]+)\}", COMPOSE_FILE.read_text())
    assert named and {ROOT / name for name in named} <= set(DOCKERFILES)
