"""The project's wheel as ``pip wheel`` builds it from the source, compiled modules included."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]


def build_wheel(work: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``pip wheel`` of a copy of the source (setuptools builds in the source tree) into ``work``,
    the compiled modules built from their ``.pyx``, with ``env`` added to the environment."""
    source = work / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPOSITORY / name, source / name)
    shutil.copytree(
        REPOSITORY / "spanner_cdc",
        source / "spanner_cdc",
        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c"),  # built, not written: Cython's
    )
    return subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(work), str(source)],
        check=False, capture_output=True, text=True, cwd=work, env={**os.environ, **env},
    )  # fmt: skip
