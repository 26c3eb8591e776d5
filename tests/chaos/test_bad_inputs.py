"""Every option of ``produce`` and ``consume`` given a value it must refuse, on the command line
and in the environment: exit 2, one line on stderr naming the option, no traceback, nothing
started. Values come from each option's own parser (the one a user's value goes through), so
a new option is covered the day it is declared.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from spanner_cdc.cli import main
from spanner_cdc.common.config import Option
from spanner_cdc.reference import COMMANDS

pytestmark = [pytest.mark.unit, pytest.mark.chaos, pytest.mark.usefixtures("restored_logging")]
#: Candidates, in order; the first one an option's parser refuses is used.
REFUSED_CANDIDATES = ("not-a-value", "-1", "0", "a'; DROP TABLE x; --", "has space", "x=", "=y", "")
#: Enough for every command to get as far as checking its options.
REQUIRED = {
    "produce": ["--project", "p", "--instance", "i", "--database", "d", "--change-stream", "S",
                "--kafka-bootstrap", "127.0.0.1:1"],
    "poll": ["--project", "p", "--instance", "i", "--database", "d", "--table", "T",
             "--commit-timestamp-column", "C", "--kafka-bootstrap", "127.0.0.1:1"],
    "consume": ["--kafka-bootstrap", "127.0.0.1:1", "--topic-prefix", "P"],
}  # fmt: skip


def refused_value(option: Option) -> str | None:
    for candidate in REFUSED_CANDIDATES:
        try:
            option.parse(candidate)
        except (ValueError, TypeError):
            return candidate
    return None  # free text (a name, an address): refused later, by the service it names


def cases() -> Iterator[tuple[str, Option, str]]:
    for command, options in COMMANDS.items():
        for option in options:
            value = refused_value(option)
            if value is not None:
                yield command, option, value


CASES = list(cases())


def without(argv: list[str], name: str) -> list[str]:
    """``argv`` (pairs of option and value) without ``name``, so the environment decides it."""
    pairs = zip(argv[::2], argv[1::2], strict=True)
    return [item for pair in pairs if pair[0] != name for item in pair]


def run(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("command", "option", "value"), CASES, ids=[f"{c}--{o.name}" for c, o, _ in CASES])
def test_an_invalid_value_is_one_line_and_exit_2(
    command: str,
    option: Option,
    value: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    required = REQUIRED[command]
    for source in ("command line", "environment"):
        argv = [command, *without(required, f"--{option.name}")]
        if source == "command line":
            argv += [f"--{option.name}", value]
            monkeypatch.delenv(option.env_var, raising=False)
        else:
            monkeypatch.setenv(option.env_var, value)
        code, err = run(argv, capsys)
        assert code == 2, f"{source}: exit {code}: {err}"
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, err
        named = f"--{option.name}" if source == "command line" else option.env_var
        assert named in lines[0], f"{source}: the error does not name {named}: {lines[0]}"


def test_most_options_are_covered() -> None:
    """Free-text options (names, addresses, paths) are checked by what they name, elsewhere."""
    total = sum(len(options) for options in COMMANDS.values())
    assert len(CASES) >= total // 2, f"only {len(CASES)} of {total} options refuse anything"


def test_no_credentials_and_no_emulator_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("SPANNER_EMULATOR_HOST", "SPANNER_CDC_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # no metadata-server probe: this is not a GCE VM
    code, err = run(["produce", *REQUIRED["produce"]], capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "no Google Cloud credentials" in err


def test_a_credentials_file_google_cannot_read_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("SPANNER_EMULATOR_HOST", "SPANNER_CDC_EMULATOR_HOST"):
        monkeypatch.delenv(name, raising=False)
    garbage = tmp_path / "key.json"
    garbage.write_text('{"type": "service_account", "private_key": "not a key"}')
    code, err = run(["produce", *REQUIRED["produce"], "--credentials-file", str(garbage)], capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "holds no credentials Spanner accepts" in err and "not a key" not in err


def test_cloud_options_with_the_emulator_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    key = tmp_path / "key.json"
    key.write_text("{}")
    for extra in (["--credentials-file", str(key)], ["--spanner-endpoint", "spanner.example.com:443"]):
        argv = ["produce", *REQUIRED["produce"], "--emulator-host", "127.0.0.1:1", *extra]
        code, err = run(argv, capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "the emulator" in err and "takes neither" in err
