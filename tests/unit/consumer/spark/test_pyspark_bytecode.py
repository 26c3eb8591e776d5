"""Bytecode added to Spark's worker zips (``consumer.spark.pyspark_bytecode``) is what ``zipimport``
loads, stands only for its own source, and is added once."""

from __future__ import annotations

import importlib.util
import zipfile
import zipimport
from pathlib import Path

import pytest

from spanner_cdc.consumer.spark.pyspark_bytecode import add_bytecode, worker_zips

pytestmark = pytest.mark.unit

MODULES = {
    "pkg/__init__.py": b"",
    "pkg/mod.py": b"VALUE = 42\n",
    "pkg/tests/test_mod.py": b"def test_it():\n    pass\n",
    "pkg/broken.py": b"def broken(:\n",
    "pkg/data.txt": b"not python",
}


def _zip(path: Path, entries: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return path


def _loaded_from(archive: Path, module: str) -> str:
    """The zip entry ``zipimport`` loads ``module`` from: ``.pyc`` when it uses the bytecode."""
    package = module.rpartition(".")[0].replace(".", "/")
    importer = zipimport.zipimporter(str(archive / package) if package else str(archive))
    importer.invalidate_caches()  # zipimport keeps a zip's directory by path: the tests rewrite it
    return Path(importer.get_filename(module)).name


def test_zipimport_loads_the_added_bytecode_and_the_rest_stays(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "pyspark.zip", MODULES)
    assert _loaded_from(archive, "pkg.mod") == "mod.py"

    assert add_bytecode(archive) == 2  # __init__ and mod: not the tests, not what does not compile

    with zipfile.ZipFile(archive) as rewritten:
        names = set(rewritten.namelist())
        assert {name: rewritten.read(name) for name in MODULES} == MODULES
        pyc = rewritten.read("pkg/mod.pyc")
    assert names - MODULES.keys() == {"pkg/__init__.pyc", "pkg/mod.pyc"}
    assert pyc[:4] == importlib.util.MAGIC_NUMBER
    assert pyc[8:16] == importlib.util.source_hash(MODULES["pkg/mod.py"])
    assert _loaded_from(archive, "pkg.mod") == "mod.pyc"
    assert _loaded_from(archive, "pkg") == "__init__.pyc"


def test_bytecode_for_other_source_is_not_used(tmp_path: Path) -> None:
    """Checked hash-based: bytecode whose source changed is refused and the source compiled."""
    archive = _zip(tmp_path / "pyspark.zip", MODULES)
    add_bytecode(archive)
    with zipfile.ZipFile(archive) as done:
        entries = {name: done.read(name) for name in done.namelist()}
    changed = _zip(tmp_path / "changed.zip", entries | {"pkg/mod.py": b"VALUE = 43\n"})

    assert _loaded_from(changed, "pkg.mod") == "mod.py"


def test_added_once_and_another_pythons_bytecode_replaced(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "pyspark.zip", MODULES | {"pkg/mod.pyc": b"\0\0\r\n" + bytes(12) + b"old"})
    assert _loaded_from(archive, "pkg.mod") == "mod.py"  # another magic number: source

    assert add_bytecode(archive) == 2
    before = archive.read_bytes()
    assert add_bytecode(archive) == 0

    assert archive.read_bytes() == before
    assert _loaded_from(archive, "pkg.mod") == "mod.pyc"


def test_the_zips_spark_puts_on_its_workers_path(tmp_path: Path) -> None:
    lib = tmp_path / "python" / "lib"
    lib.mkdir(parents=True)
    for name in ("pyspark.zip", "py4j-0.10.9.9-src.zip", "other.zip"):
        _zip(lib / name, {})

    assert [path.name for path in worker_zips(tmp_path)] == ["pyspark.zip", "py4j-0.10.9.9-src.zip"]
