"""The three services of the embedded stack, each resolved in the order docs/design.md §2 fixes.

For every service: an address given in the environment → a local binary → a container through
testcontainers when a Docker engine answers → one ServiceError naming what is missing and how
to install it. A resolved service is a :class:`ServiceHandle`, which is plain data so that
``spanner-cdc stack down`` in another process can stop what ``stack up`` started.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from spanner_cdc.common.jars import JarsMissingError, jars
from spanner_cdc.common.secrets import redact
from spanner_cdc.stack.kafka import KafkaNode, warm_up_transactions
from spanner_cdc.stack.process import (
    LocalProcess,
    ServiceError,
    free_port,
    stop_process_group,
    wait_until_ready,
)

SPANNER_ENV = "SPANNER_EMULATOR_HOST"
KAFKA_ENV = "SPANNER_CDC_KAFKA_BOOTSTRAP"
POSTGRES_ENV = "SPANNER_CDC_POSTGRES_DSN"
EMULATOR_PROJECT = "spanner-cdc"
START_TIMEOUT_SECONDS = 60.0
#: Embedded PostgreSQL data directories: ``<temp dir>/spanner-cdc-postgres-…``.
POSTGRES_DATA_PREFIX = "spanner-cdc-postgres-"


@dataclass(frozen=True)
class _Account:
    """Who a local service runs as: this process's user, or (as root) another user and that
    user's group, without root's supplementary groups."""

    user: str | None
    uid: int | None = None
    gid: int | None = None

    @classmethod
    def of(cls, user: str | None) -> _Account:
        if user is None:
            return cls(None)
        entry = pwd.getpwnam(user)
        return cls(user, entry.pw_uid, entry.pw_gid)

    def give(self, *paths: Path) -> None:
        if self.uid is not None and self.gid is not None:
            for path in paths:
                os.chown(path, self.uid, self.gid)

    def subprocess_options(self) -> dict[str, Any]:
        if self.user is None:
            return {}
        return {"user": self.user, "group": self.gid, "extra_groups": []}


@dataclass
class ServiceHandle:
    """Where a service answers and how to stop it (nothing to stop for an external one)."""

    name: str
    endpoint: str
    source: str
    #: For an address from the environment: the variable it came from (read again on load, so
    #: that the state file never holds a password).
    env_var: str | None = None
    pgid: int | None = None
    container_id: str | None = None
    data_dir: str | None = None
    #: The program the process group's leader runs: checked before the group is stopped.
    command: str | None = None

    def stop(self) -> None:
        """Stop what this handle started — after checking it is still that: a state file can be
        stale (the pid reused) or edited, and ``stack down`` must not kill or delete anything else."""
        if self.pgid is not None:
            leader = _leader_command(self.pgid)
            if leader is not None and leader != self.command:
                raise ServiceError(
                    f"{self.name}: process group {self.pgid} runs {leader!r}, not {self.command!r}; "
                    "not stopped"
                )
            if leader is not None:
                stop_process_group(self.pgid)
        if self.data_dir is not None:
            data = Path(self.data_dir)
            ours = data.parent == Path(tempfile.gettempdir()) and data.name.startswith(POSTGRES_DATA_PREFIX)
            if not (ours and (data / "PG_VERSION").is_file()):
                raise ServiceError(f"{self.name}: {data} is not an embedded PostgreSQL data directory; kept")
            shutil.rmtree(data, ignore_errors=True)
        if self.container_id is not None:
            import docker

            with contextlib.suppress(docker.errors.NotFound):
                docker.from_env().containers.get(self.container_id).remove(force=True)

    @property
    def shown_endpoint(self) -> str:
        """The address as a person may see it (a connection string's password hidden)."""
        return redact(self.endpoint)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "endpoint": self.shown_endpoint}

    @classmethod
    def from_json(cls, state: dict[str, Any]) -> ServiceHandle:
        handle = cls(**state)
        if handle.env_var and os.environ.get(handle.env_var):
            handle.endpoint = os.environ[handle.env_var]
        return handle


def _leader_command(pgid: int) -> str | None:
    """The program a process group's leader runs; None when it is gone."""
    try:
        return (Path("/proc") / str(pgid) / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return None


def resolve(
    name: str,
    *,
    env_var: str,
    probe: Callable[[str], None],
    local: Callable[[], ServiceHandle | None],
    container: Callable[[], ServiceHandle] | None,
    install_help: str,
) -> ServiceHandle:
    """Apply the resolution order; ``local`` returns None when no binary is installed,
    ``container`` is None for a service that always runs locally once set up (Kafka: its jars
    come with the project's setup)."""
    given = os.environ.get(env_var)
    if given:
        try:
            probe(given)
        except Exception as exc:
            raise ServiceError(
                f"{name}: {env_var}={redact(given)} does not answer: {probe_error(exc)}"
            ) from None
        return ServiceHandle(name, given, "environment", env_var=env_var)
    handle = local()
    if handle is not None:
        return handle
    if container is not None and docker_engine_answers():
        return container()
    found = "no local binary, no Docker engine" if container is not None else "no local installation"
    raise ServiceError(f"{name}: no address in {env_var}, {found}. {install_help}")


def docker_engine_answers() -> bool:
    try:
        import docker

        return bool(docker.from_env(timeout=3).ping())
    except Exception:
        return False


def _start_local(
    name: str,
    argv: list[str],
    endpoint: str,
    workdir: Path,
    probe: Callable[[str], None],
    *,
    account: _Account = _Account(None),
    data_dir: Path | None = None,
) -> ServiceHandle:
    process = LocalProcess.start(
        name, argv, workdir / f"{name}.log", cwd=data_dir or workdir, **account.subprocess_options()
    )
    handle = ServiceHandle(
        name,
        endpoint,
        "local",
        pgid=process.pgid,
        data_dir=str(data_dir) if data_dir else None,
        command=argv[0],
    )
    try:
        process.wait_ready(lambda: probe(endpoint), START_TIMEOUT_SECONDS)
    except BaseException:
        handle.stop()
        raise
    return handle


# --- Spanner emulator -------------------------------------------------------------------------


def probe_spanner(host: str) -> None:
    """A real gRPC round trip: list the emulator's instance configs."""
    from spanner_cdc.common.spanner_client import emulator_client

    client = emulator_client(host, EMULATOR_PROJECT)
    list(client.list_instance_configs(page_size=1))


def find_emulator_gateway() -> Path | None:
    """``<sdk root>/bin/cloud_spanner_emulator/gateway_main``, the sdk root from gcloud."""
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        return None
    result = subprocess.run(
        [gcloud, "info", "--format=value(installation.sdk_root)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    gateway = Path(result.stdout.strip()) / "bin" / "cloud_spanner_emulator" / "gateway_main"
    return gateway if result.returncode == 0 and gateway.is_file() else None


def start_spanner(workdir: Path, churn_seconds: int | None = None) -> ServiceHandle:
    """Resolve the emulator; ``churn_seconds`` shortens partition-token lifetimes (docs/design.md §2)."""

    def local() -> ServiceHandle | None:
        gateway = find_emulator_gateway()
        if gateway is None:
            return None
        grpc_port, http_port = free_port(), free_port()
        argv = [
            str(gateway),
            "--hostname",
            "127.0.0.1",
            "--grpc_port",
            str(grpc_port),
            "--http_port",
            str(http_port),
            "--grpc_binary",
            str(gateway.parent / "emulator_main"),
        ]
        if churn_seconds:
            argv += ["--override_change_stream_partition_token_alive_seconds", str(churn_seconds)]
        return _start_local("spanner", argv, f"127.0.0.1:{grpc_port}", workdir, probe_spanner)

    def container() -> ServiceHandle:
        from testcontainers.core.container import DockerContainer

        command = (
            (
                f"./gateway_main --hostname 0.0.0.0 --override_change_stream_partition_token_alive_seconds "
                f"{churn_seconds}"
            )
            if churn_seconds
            else None
        )
        started = DockerContainer("gcr.io/cloud-spanner-emulator/emulator", command=command)
        started.with_exposed_ports(9010).start()
        endpoint = f"{started.get_container_host_ip()}:{started.get_exposed_port(9010)}"
        handle = ServiceHandle(
            "spanner", endpoint, "container", container_id=started.get_wrapped_container().id
        )
        _wait_container(handle, probe_spanner)
        return handle

    return resolve(
        "spanner",
        env_var=SPANNER_ENV,
        probe=probe_spanner,
        local=local,
        container=container,
        install_help=(
            "Install the Cloud Spanner emulator (Debian package google-cloud-cli-spanner-emulator from "
            "the Google Cloud apt repository) or set SPANNER_EMULATOR_HOST=host:port."
        ),
    )


# --- Kafka ------------------------------------------------------------------------------------


def probe_kafka(bootstrap: str) -> None:
    """A real metadata request; raises when the broker does not answer within 3 s."""
    from confluent_kafka.admin import AdminClient

    # log_level 0: "connection refused" while the broker boots is expected, not worth printing.
    AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=3)


def start_kafka(workdir: Path) -> ServiceHandle:
    """Apache Kafka from the project's jars (stack.kafka), its data in ``<workdir>/kafka``."""

    def local() -> ServiceHandle | None:
        try:
            jars("kafka")
        except JarsMissingError:
            return None
        node = KafkaNode(workdir / "kafka", free_port(), free_port())
        node.prepare()
        handle = _start_local("kafka", node.argv(), node.bootstrap, workdir, probe_kafka)
        try:
            warm_up_transactions(node.bootstrap)
        except BaseException:
            handle.stop()
            raise
        return handle

    return resolve(
        "kafka",
        env_var=KAFKA_ENV,
        probe=probe_kafka,
        local=local,
        container=None,
        install_help=(
            "Resolve the broker's jars (make, or scripts/jars.sh DIR with SPANNER_CDC_JARS=DIR) or set "
            "SPANNER_CDC_KAFKA_BOOTSTRAP=host:port."
        ),
    )


# --- PostgreSQL -------------------------------------------------------------------------------


def probe_postgres(dsn: str) -> None:
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=3) as connection:
            connection.execute("SELECT 1").fetchone()
    except psycopg.ProgrammingError:  # libpq's parse errors quote the string, password and all
        raise ServiceError(
            "the connection string does not parse (libpq's message may quote the password)"
        ) from None


def probe_error(error: Exception) -> str:
    """A probe's failure as a person may read it: no password, even one libpq quoted."""
    return redact(str(error))


def find_postgres_bindir() -> Path | None:
    """Where ``initdb`` and ``postgres`` live: ``pg_config --bindir``, else Debian's layout."""
    candidates = []
    if shutil.which("pg_config"):
        result = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=False)
        candidates.append(Path(result.stdout.strip()))
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    return next((d for d in candidates if (d / "initdb").is_file() and (d / "postgres").is_file()), None)


def write_private(path: Path, text: str) -> None:
    """``text`` into ``path``, readable by its owner only (0600) — also when the file existed
    with a wider mode, which ``touch(mode=…)`` keeps; made so before the secret is written."""
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(text)


def start_postgres(workdir: Path) -> ServiceHandle:
    """initdb into a fresh directory and run the server as a non-root user on a free port.

    PostgreSQL refuses to run as root, so as root the server runs as the user named by
    SPANNER_CDC_POSTGRES_USER (default ``nobody``) and that user's own group (not root's). Its
    data directory is then a fresh directory under the system temp dir rather than inside the
    work directory, whose parents (a home directory, pytest's 0700 temp dirs) that user usually
    cannot traverse.

    Connections need a password (scram-sha-256; nothing is trusted, not even 127.0.0.1): a
    random one, kept in ``<workdir>/postgres.pgpass`` (mode 0600, libpq's format). The
    connection string names that file (``passfile=``) instead of carrying the password, so it
    can be printed, saved and passed on without showing a secret.
    """

    def local() -> ServiceHandle | None:
        bindir = find_postgres_bindir()
        if bindir is None:
            return None
        user = os.environ.get("SPANNER_CDC_POSTGRES_USER", "nobody") if os.geteuid() == 0 else None
        account = _Account.of(user)
        data = Path(tempfile.mkdtemp(prefix=POSTGRES_DATA_PREFIX))
        password = secrets.token_urlsafe(24)
        with tempfile.NamedTemporaryFile("w", prefix="spanner-cdc-pw-", delete=False) as pwfile:
            pwfile.write(password + "\n")
        try:
            account.give(data, Path(pwfile.name))
            initdb = subprocess.run(
                [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=scram-sha-256",
                 f"--pwfile={pwfile.name}", "-E", "UTF8", "--no-sync"],
                capture_output=True,
                text=True,
                check=False,
                **account.subprocess_options(),
            )  # fmt: skip
        finally:
            Path(pwfile.name).unlink()
        if initdb.returncode != 0:
            shutil.rmtree(data, ignore_errors=True)
            raise ServiceError(f"postgres: initdb failed:\n{initdb.stdout}{initdb.stderr}")
        port = free_port()
        argv = [
            str(bindir / "postgres"),
            "-D",
            str(data),
            "-p",
            str(port),
            "-k",
            str(data),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
        ]
        passfile = workdir / "postgres.pgpass"
        write_private(passfile, f"127.0.0.1:{port}:*:postgres:{password}\n")
        dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres?passfile={passfile}"
        return _start_local("postgres", argv, dsn, workdir, probe_postgres, account=account, data_dir=data)

    def container() -> ServiceHandle:
        from testcontainers.postgres import PostgresContainer

        started = PostgresContainer("postgres:16", driver=None).start()
        handle = ServiceHandle(
            "postgres",
            started.get_connection_url(),
            "container",
            container_id=started.get_wrapped_container().id,
        )
        _wait_container(handle, probe_postgres)
        return handle

    return resolve(
        "postgres",
        env_var=POSTGRES_ENV,
        probe=probe_postgres,
        local=local,
        container=container,
        install_help=(
            "Install the PostgreSQL server (apt-get install postgresql) or set "
            "SPANNER_CDC_POSTGRES_DSN=postgresql://user@host:port/db."
        ),
    )


def _wait_container(handle: ServiceHandle, probe: Callable[[str], None]) -> None:
    try:
        wait_until_ready(handle.name, lambda: probe(handle.endpoint), START_TIMEOUT_SECONDS)
    except BaseException:
        handle.stop()
        raise
