"""Bytecode for the Python that Spark's worker processes import, added once at install time.

Spark starts its Python processes (the worker daemon, and for every streaming query the Python
source's runner and planners) with ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first
on ``PYTHONPATH``, ahead of the installed PySpark. Those zips hold source only, and Python never
writes bytecode for what it imports from a zip — so every such process compiled PySpark again,
which took longer than the import itself once the zip holds bytecode. A consumer pays it when
it starts and for each query; the test suite, which starts hundreds, paid it every time.

:func:`add_bytecode` rewrites such a zip with a ``.pyc`` beside every ``.py`` (test modules
excepted: no worker imports them), in the format ``zipimport`` reads: PEP 552's checked
hash-based pycs, which Python validates against the source's hash in the same zip, so bytecode
can never stand for other source. A ``.pyc`` for another Python version (another magic number)
is skipped by ``zipimport``, which then compiles the source as before: nothing can break, only
stop being faster. Run by ``make`` after installing, and by the consumer's Dockerfile::

    python -m spanner_cdc.consumer.spark.pyspark_bytecode
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path

#: PEP 552's flags: hash-based (bit 0), checked against the source when imported (bit 1).
_CHECKED_HASH_FLAGS = (0b11).to_bytes(4, "little")


def worker_zips(spark_home: Path) -> list[Path]:
    """The zips Spark puts first on its Python processes' path (``PythonUtils.sparkPythonPath``)."""
    lib = spark_home / "python" / "lib"
    return sorted(lib.glob("pyspark.zip")) + sorted(lib.glob("py4j-*-src.zip"))


def add_bytecode(archive: Path) -> int:
    """Rewrite ``archive`` with this Python's bytecode beside its modules; the number added.

    Idempotent: a zip that already holds this Python's bytecode is left alone (0); bytecode of
    another Python is replaced. The new zip replaces the old one atomically, so a process
    starting meanwhile sees one or the other."""
    with zipfile.ZipFile(archive) as source:
        entries = source.infolist()
        modules = {entry.filename for entry in entries if _needs_bytecode(entry.filename)}
        if not modules or _has_this_pythons_bytecode(source, entries):
            return 0
        handle, scratch = tempfile.mkstemp(prefix=archive.name, dir=archive.parent)
        os.close(handle)
        added = 0
        try:
            with zipfile.ZipFile(scratch, "w", zipfile.ZIP_DEFLATED) as target:
                for entry in entries:
                    if entry.filename.endswith(".pyc") and entry.filename[:-1] in modules:
                        continue  # another Python's: replaced below
                    data = source.read(entry)
                    target.writestr(entry, data)
                    pyc = (
                        _checked_pyc(data, f"{archive}{os.sep}{entry.filename}")
                        if entry.filename in modules
                        else None
                    )
                    if pyc is not None:
                        target.writestr(entry.filename + "c", pyc)
                        added += 1
            os.chmod(scratch, archive.stat().st_mode & 0o777)
            os.replace(scratch, archive)
        finally:
            Path(scratch).unlink(missing_ok=True)
    return added


def _needs_bytecode(name: str) -> bool:
    return name.endswith(".py") and "/tests/" not in name and not name.startswith("tests/")


def _has_this_pythons_bytecode(archive: zipfile.ZipFile, entries: list[zipfile.ZipInfo]) -> bool:
    """Whether the zip's bytecode (if any) was written for this Python (its magic number)."""
    first = next((entry for entry in entries if entry.filename.endswith(".pyc")), None)
    return first is not None and archive.read(first)[:4] == importlib.util.MAGIC_NUMBER


def _checked_pyc(source: bytes, filename: str) -> bytes | None:
    """A checked hash-based ``.pyc`` of ``source`` (None if it does not compile here: such a
    module stays source only, as before). ``filename`` is the path zipimport would give it, so
    tracebacks read the same."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            code = compile(source, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return None
    header = importlib.util.MAGIC_NUMBER + _CHECKED_HASH_FLAGS + importlib.util.source_hash(source)
    return header + marshal.dumps(code)


def main() -> int:
    """Add bytecode to the worker zips of the Spark that runs the consumer: ``SPARK_HOME`` when
    set, else the installed PySpark's own (what pip's PySpark starts Spark from)."""
    import pyspark

    spark_home = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)
    zips = worker_zips(spark_home)
    if not zips:
        print(f"pyspark bytecode: no worker zips under {spark_home}/python/lib; nothing to do")
        return 0
    try:
        added = {archive.name: add_bytecode(archive) for archive in zips}
    except OSError as error:
        print(f"pyspark bytecode: {error} (Spark's workers will compile PySpark as before)", file=sys.stderr)
        return 0
    done = ", ".join(
        f"{name} {count} modules" if count else f"{name} already done" for name, count in added.items()
    )
    print(f"pyspark bytecode: {done}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
