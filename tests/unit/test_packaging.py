"""What ``pip install spanner-cdc`` puts on a machine, and what each service's extra must bring."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.wheel import REPOSITORY, build_wheel

pytestmark = pytest.mark.unit
#: Makes importing the named top-level packages fail, in a fresh interpreter.
BLOCK_IMPORTS = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ImportError('blocked for this test: ' + name)
sys.meta_path.insert(0, Block())
"""


def python_without(blocked: set[str], script: str) -> subprocess.CompletedProcess[str]:
    """``script`` run by a fresh interpreter in which the ``blocked`` packages cannot be imported."""
    code = BLOCK_IMPORTS.format(blocked=blocked) + script
    return subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)


def test_the_wheel_installs_one_top_level_package(project_wheel: Path) -> None:
    names = zipfile.ZipFile(project_wheel).namelist()
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"spanner_cdc"}
    assert "spanner_cdc/schemas/avsc/envelope.avsc" in names
    # Each compiled module, and its types for mypy in projects that import them.
    sources = list((REPOSITORY / "spanner_cdc").rglob("*.pyx"))
    assert sources
    for module in (str(pyx.relative_to(REPOSITORY).with_suffix("")) for pyx in sources):
        assert any(re.fullmatch(rf"{module}\.cpython-.*\.so", name) for name in names)
        assert f"{module}.pyi" in names


def test_a_machine_without_a_c_compiler_is_told_so_in_one_line(tmp_path: Path) -> None:
    built = build_wheel(tmp_path, CC=str(tmp_path / "no-compiler"))
    assert built.returncode != 0
    [line] = [line.strip() for line in built.stderr.splitlines() if "spanner-cdc: building" in line]
    assert "needs a C compiler and Python's headers" in line and "no-compiler" in line


@pytest.mark.parametrize(
    ("command", "absent"),
    [
        ("produce", ("pyspark", "pyarrow", "duckdb", "psycopg")),  # the producer image has no Spark
        ("consume", ("google", "asyncio_throttle")),  # the consumer image has no Spanner client
    ],
)
def test_each_service_runs_without_the_other_ones_libraries(command: str, absent: tuple[str, ...]) -> None:
    module = {"produce": "spanner_cdc.producer.main", "consume": "spanner_cdc.consumer.main"}[command]
    result = python_without(
        set(absent),
        f"import {module}\n"
        "from spanner_cdc.cli import main\n"
        f"try:\n    main([{command!r}, '--help'])\nexcept SystemExit as stop:\n    sys.exit(stop.code)\n",
    )
    assert result.returncode == 0, result.stderr
    assert f"usage: spanner-cdc {command}" in result.stdout


def test_the_executors_tasks_import_no_database_driver() -> None:
    """Every Python worker Spark starts imports the tasks' modules; DuckDB and psycopg, which only
    the driver uses (the replica's merge), cost a worker about 0.3 s more at each start."""
    tasks = "spanner_cdc.consumer.tasks"
    result = python_without({"duckdb", "psycopg"}, f"import {tasks}\n")
    assert result.returncode == 0, result.stderr
