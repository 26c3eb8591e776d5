"""The JVM processes the project starts: where their artifacts are, the Java runtime, their logs.

The artifacts are the embedded Kafka broker's jars and
Spark's own connectors, resolved from Maven Central at setup (``scripts/jars.sh``, by the
coordinates pinned in ``jvm/<set>/pom.xml``), never at run time.

They live in ``<prefix>/share/spanner-cdc/jars/<set>/`` of the Python environment the project is
installed in (``make`` puts them in ``.venv``), or under ``$SPANNER_CDC_JARS`` when that is set.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from spanner_cdc.errors import SpannerCdcError

JARS_ENV = "SPANNER_CDC_JARS"
LOG4J2_TO_FILE = """\
status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{ISO8601}} %p %c: %m%n%ex
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
"""


class JarsMissingError(SpannerCdcError):
    """A set of jars was never resolved; the message says how to resolve it."""


def jars_root() -> Path:
    given = os.environ.get(JARS_ENV)
    return Path(given) if given else Path(sys.prefix) / "share" / "spanner-cdc" / "jars"


def jars(set_name: str) -> list[Path]:
    """Every jar of ``set_name`` (``kafka``, ``spark``), sorted; the error names the fix."""
    found = sorted((jars_root() / set_name).glob("*.jar"))
    if not found:
        raise JarsMissingError(
            f"no {set_name} jars in {jars_root() / set_name}: run make (or scripts/jars.sh "
            f"{jars_root()}), or set {JARS_ENV} to a directory holding {set_name}/*.jar"
        )
    return found


def java_binary() -> str:
    """``$JAVA_HOME/bin/java``, else ``java`` on the PATH, as an absolute path."""
    home = os.environ.get("JAVA_HOME")
    candidate = Path(home) / "bin" / "java" if home else None
    if candidate is not None and candidate.is_file():
        return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise JarsMissingError("no Java runtime: install a JDK 17 (apt-get install openjdk-17-jdk-headless)")
    return str(Path(found).resolve())


def log4j2_to_file(configuration: Path, log_file: Path) -> str:
    """Write a log4j2 configuration to ``configuration`` that sends a JVM's logs (info and up)
    to ``log_file`` instead of its console; the JVM option that loads it."""
    configuration.write_text(LOG4J2_TO_FILE.format(log_file=log_file))
    return f"-Dlog4j2.configurationFile=file:{configuration}"
