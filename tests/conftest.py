"""Session fixtures: one embedded stack per test run, stopped also when tests fail or on SIGTERM."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spanner_cdc.common.logs import PROJECT_LOGGERS
from spanner_cdc.consumer.config import ConsumerConfig
from spanner_cdc.stack import EmbeddedStack, stop_on_signals
from testkit.consumer_run import (
    SQL_REPLICAS,
    ConfigFactory,
    consumer_config,
    fresh_postgres_database,
    unique_prefix,
)
from tests.support.object_store import ObjectStore, object_store_server
from tests.support.spark_class_archive import OPTIONS_VARIABLE, ArchiveRecording, with_options
from tests.support.wheel import build_wheel

#: The xdist group of every test that uses the run's Spark session (the ``spark`` fixture); xdist
#: appends it to their node ids as ``@spark``.
SPARK_GROUP = "spark"
#: The xdist group of every test that uses the run's one build of the wheel (``project_wheel``).
WHEEL_GROUP = "wheel"
#: Each fixture whose tests share one worker, and their group.
GROUP_OF_FIXTURE = {"spark": SPARK_GROUP, "project_wheel": WHEEL_GROUP}


def xdist_group(item: pytest.Item) -> str | None:
    """The group of the first fixture of :data:`GROUP_OF_FIXTURE` that ``item`` uses, if any."""
    used = getattr(item, "fixturenames", ())
    return next((group for fixture, group in GROUP_OF_FIXTURE.items() if fixture in used), None)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups from the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With pytest-xdist (``make test`` runs two workers, ``--dist loadgroup``), every test that
    uses the run's Spark session goes to one worker, in file order: the run keeps one Spark
    session. The other worker runs the rest beside it, the ``spark`` tests that only start Spark
    in processes of their own (demos, chaos) included — most tests wait rather than compute
    (docs/design.md, Tests, has the measurements). The tests of the project's wheel go to one
    worker too, so that it is built once."""
    if config.pluginmanager.hasplugin("xdist"):
        for item in items:
            group = xdist_group(item)
            if group is not None:
                item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_finish(session: pytest.Session) -> None:
    """xdist says a test's group by a suffix of its node id, which pytest 9.2 ignores
    (pytest-dev/pytest-xdist#1386): the tests would then spread over both workers, two Spark
    sessions at once. Refuse to run rather than do that silently."""
    if getattr(session.config.option, "loadgroup", False):  # set on xdist workers
        ungrouped = [
            item.nodeid
            for item in session.items
            if (group := xdist_group(item)) is not None and not item.nodeid.endswith(f"@{group}")
        ]
        if ungrouped:
            raise pytest.UsageError(f"--dist loadgroup did not group the tests: {ungrouped[0]}")


@pytest.fixture(scope="session")
def stack() -> Iterator[EmbeddedStack]:
    with stop_on_signals():
        started = EmbeddedStack.start()
        try:
            yield started
        finally:
            started.stop()


@pytest.fixture(scope="session")
def object_store() -> Iterator[ObjectStore]:
    """An S3-compatible server on 127.0.0.1 (tests/support/object_store.py), one per test run."""
    with object_store_server() as store:
        yield store


@pytest.fixture(scope="session")
def project_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built once per test run (a build compiles the Cython modules): its
    tests share one xdist group (``WHEEL_GROUP``), so one worker builds it."""
    work = tmp_path_factory.mktemp("wheel")
    built = build_wheel(work)
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = work.glob("spanner_cdc-*.whl")
    return wheel


@pytest.fixture(scope="session")
def churn_spanner() -> Iterator[str]:
    """A second emulator whose partition tokens live 2-4 s: splits and merges within seconds."""
    with stop_on_signals():
        started = EmbeddedStack.start(names=("spanner",), churn_seconds=2)
        try:
            yield started.endpoint("spanner")
        finally:
            started.stop()


@pytest.fixture(scope="session")
def spark_classes(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Iterator[ArchiveRecording]:
    """Spark JVMs started once the recording is done (the session's own if it starts later,
    each ``spanner-cdc consume`` and demo the tests launch) map their classes from one archive
    (``tests/support/spark_class_archive.py``): about 5 s less per start. Recorded in the
    background from the first ``spark`` test on, once per run: with pytest-xdist, in the directory
    the workers share, by the first worker to ask. If the recording fails, the tests run as they
    would, with a warning in the summary."""
    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":  # pytest-xdist's: each worker's base directory is in the run's
        shared = shared.parent
    recording = ArchiveRecording(shared / "spark-classes")
    try:
        yield recording
    finally:
        recording.stop()


@pytest.fixture(scope="session", autouse=True)
def _spark_scratch_in_the_run_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Spark's block-manager and work directories and the native libraries its JVM unpacks go
    into the run's own directory, which pytest prunes (it keeps the last three runs), instead of
    /tmp: a consumer killed with SIGKILL, as the restart and chaos tests do, runs no shutdown
    hook to remove them. (Not ``TMPDIR``: the embedded PostgreSQL runs as ``nobody`` when the
    tests run as root, and cannot read its files under pytest's private directories.)"""
    scratch = tmp_path_factory.mktemp("spark-scratch")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARK_LOCAL_DIRS", str(scratch))
        env.setenv(OPTIONS_VARIABLE, with_options(f"-Djava.io.tmpdir={scratch}"))
        yield


@pytest.fixture(autouse=True)
def _spark_starts_from_the_class_archive(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("spark") is not None:
        recording: ArchiveRecording = request.getfixturevalue("spark_classes")
        recording.use_if_recorded()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One local[2] Spark session per test run, with Spark's Kafka connector and Delta Lake."""
    from spanner_cdc.consumer.spark.session import spark_session

    logs = tmp_path_factory.mktemp("spark-logs")
    session = spark_session("local[2]", "spanner-cdc-tests", log_dir=logs, delta=True)
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()


@pytest.fixture(params=SQL_REPLICAS)
def configure(request: pytest.FixtureRequest, stack: EmbeddedStack, tmp_path: Path) -> ConfigFactory:
    """A consumer configuration per test and replica: its own topics, output directory and
    replica database."""
    replica = str(request.param)
    dsn = fresh_postgres_database(stack.endpoint("postgres")) if replica == "postgres" else None
    prefix = unique_prefix("T")

    def make(**overrides: Any) -> ConsumerConfig:
        return consumer_config(stack.endpoint("kafka"), prefix, tmp_path / "out", replica, dsn, **overrides)

    return make


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """For tests that configure logging (``main``, ``spanner_cdc.logs.configure``): the root
    handler they install points at the test's captured stderr, which closes after it, and the
    levels they set would leak into later tests."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    ours = {name: logging.getLogger(name).level for name in PROJECT_LOGGERS}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, previous in ours.items():
        logging.getLogger(name).setLevel(previous)
