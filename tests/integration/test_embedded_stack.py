"""The embedded stack end to end: Spanner write → change stream → Avro on Kafka → PostgreSQL.

Real emulator, real Apache Kafka, real PostgreSQL. The change-stream walk here is the simple one of
tests/support; the producer issue brings the real reader.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from spanner_cdc.common.jars import jars
from spanner_cdc.schemas.events import EventBuilder
from spanner_cdc.schemas.records import DataChangeRecord
from spanner_cdc.schemas.wire import SchemaStore, WriterSchema, encode
from spanner_cdc.stack import EmbeddedStack, ServiceError
from spanner_cdc.stack.process import free_port
from spanner_cdc.stack.services import start_kafka
from testkit.spanner_db import create_database, read_pg_change_stream
from tests.support.command_line import spanner_cdc

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_write_read_produce_consume_and_query(stack: EmbeddedStack) -> None:
    database = create_database(
        stack.endpoint("spanner"),
        [
            "CREATE TABLE accounts (id varchar(36) PRIMARY KEY, balance bigint, note text)",
            "CREATE CHANGE STREAM bank_stream FOR accounts",
        ],
        dialect="POSTGRESQL",
    )
    start = dt.datetime.now(dt.UTC)
    with database.batch() as batch:
        batch.insert("accounts", columns=["id", "balance", "note"], values=[["acc-1", 100, "hello"]])
    end = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
    time.sleep(1.5)  # the end timestamp must be in the past for the walk to finish
    records = read_pg_change_stream(database, "bank_stream", start, end)
    assert [r["table_name"] for r in records] == ["accounts"]

    builder = EventBuilder(f"{database.name}/changeStreams/bank_stream", database.database_id, "public")
    [event] = builder.build(DataChangeRecord.from_json(records[0]), None, int(time.time() * 1000))
    assert event.value["payload"] == {"id": "acc-1", "balance": 100, "note": "hello"}

    bootstrap = stack.endpoint("kafka")
    topic = f"bank_stream.accounts.{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    writer, key_writer = (
        WriterSchema.from_schema(event.table.event_schema),
        WriterSchema.from_schema(event.table.key_schema),
    )
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    producer.produce(topic, key=encode(key_writer, event.key), value=encode(writer, event.value))
    assert producer.flush(30) == 0

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "test", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    message = None
    deadline = time.monotonic() + 30
    while message is None and time.monotonic() < deadline:
        message = consumer.poll(1.0)
    consumer.close()
    assert message is not None and message.error() is None
    store = SchemaStore()
    store.add(writer.schema_json)
    raw = message.value()
    assert raw is not None
    decoded = store.decode(raw)
    assert decoded["uuid"] == event.value["uuid"]

    with psycopg.connect(stack.endpoint("postgres"), autocommit=True) as connection:
        connection.execute("CREATE TABLE accounts (id text PRIMARY KEY, balance bigint, note text)")
        payload = decoded["payload"]
        connection.execute(
            "INSERT INTO accounts VALUES (%s, %s, %s)", (payload["id"], payload["balance"], payload["note"])
        )
        row = connection.execute("SELECT id, balance, note FROM accounts").fetchone()
    assert row == ("acc-1", 100, "hello")


def test_unreachable_address_in_environment_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPANNER_CDC_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    with pytest.raises(ServiceError, match=r"kafka: SPANNER_CDC_KAFKA_BOOTSTRAP=127.0.0.1:1 does not answer"):
        start_kafka(tmp_path)


def test_address_in_environment_is_used_as_is(
    stack: EmbeddedStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPANNER_CDC_KAFKA_BOOTSTRAP", stack.endpoint("kafka"))
    handle = start_kafka(tmp_path)
    assert (handle.source, handle.endpoint, handle.pgid) == ("environment", stack.endpoint("kafka"), None)


def run_stack_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``spanner-cdc stack …`` in a subprocess, without the stack addresses of this test run
    (but those in ``env``)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SPANNER_CDC_", "SPANNER_EMULATOR"))}
    return spanner_cdc("stack", *args, env={**clean, **(env or {})}, timeout=120, cwd=cwd)


def test_stack_cli_up_status_down(tmp_path: Path) -> None:
    """What a person runs, as the README has it: ``stack up`` in their directory (the default
    ``--dir``, ``.stack`` under it) leaves services running, ``down`` stops every process."""
    up = run_stack_cli("up", "--services", "kafka,postgres", cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    assert "SPANNER_CDC_KAFKA_BOOTSTRAP=127.0.0.1:" in up.stdout
    pgids = [h.pgid for h in EmbeddedStack.load(tmp_path / ".stack").services.values()]
    try:
        status = run_stack_cli("status", cwd=tmp_path)
        assert status.returncode == 0 and status.stdout.count("ready") == 2, status.stdout
        again = run_stack_cli("up", cwd=tmp_path)
        assert again.returncode == 1 and "already up" in again.stderr and "Traceback" not in again.stderr
    finally:
        down = run_stack_cli("down", cwd=tmp_path)
    assert down.returncode == 0, down.stderr
    for pgid in pgids:
        assert pgid is not None
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)
    missing = run_stack_cli("status", cwd=tmp_path)
    assert missing.returncode == 1 and missing.stderr.startswith("spanner-cdc: no stack state")


def processes_running_in(directory: Path) -> list[int]:
    """Pids whose working directory is ``directory`` (local services run in the stack's)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")) == directory:
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_a_password_in_the_environment_is_shown_nowhere(stack: EmbeddedStack, tmp_path: Path) -> None:
    """``stack up``/``status``/``down`` with a PostgreSQL address that carries a password: the
    services it names still work, and the password is in no output and not in the state file."""
    password = embedded_password(stack)
    dsn = make_conninfo(stack.endpoint("postgres"), password=password, passfile="")
    env = {"SPANNER_CDC_POSTGRES_DSN": dsn}
    workdir = tmp_path / "stack"
    up = run_stack_cli("up", "--dir", str(workdir), "--services", "postgres", env=env)
    assert up.returncode == 0, up.stderr
    try:
        assert "SPANNER_CDC_POSTGRES_DSN from the environment" in up.stdout
        status = run_stack_cli("status", "--dir", str(workdir), env=env)
        assert status.returncode == 0 and "ready" in status.stdout, status.stdout + status.stderr
        saved = (workdir / "state.json").read_text()
    finally:
        down = run_stack_cli("down", "--dir", str(workdir), env=env)
    assert down.returncode == 0, down.stderr
    shown = up.stdout + up.stderr + status.stdout + status.stderr + down.stdout + down.stderr + saved
    assert password not in shown


def embedded_password(stack: EmbeddedStack) -> str:
    """The embedded server's generated password, from the passfile its address names."""
    passfile = Path(str(conninfo_to_dict(stack.endpoint("postgres"))["passfile"]))
    assert passfile.stat().st_mode & 0o777 == 0o600
    return passfile.read_text().strip().rsplit(":", 1)[1]


def test_embedded_postgres_wants_the_password_and_runs_in_its_own_group(stack: EmbeddedStack) -> None:
    """No trust authentication: a connection without the generated password is refused; as
    root, the server runs as its user and that user's group, without root's groups."""
    handle = stack.services["postgres"]
    if handle.source != "local":
        pytest.skip("PostgreSQL comes from the environment or a container here")
    for missing in ({"passfile": "/dev/null"}, {"password": "wrong", "passfile": ""}):
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(make_conninfo(handle.endpoint, **missing), connect_timeout=5).close()
    if os.geteuid() == 0:
        assert handle.pgid is not None
        status = dict(
            line.split(":", 1)
            for line in (Path("/proc") / str(handle.pgid) / "status").read_text().splitlines()
        )
        assert status["Uid"].split()[0] != "0" and status["Gid"].split()[0] != "0"
        assert "0" not in status["Groups"].split()


def test_down_stops_only_what_the_stack_started(tmp_path: Path) -> None:
    """A stale or edited state file: ``stack down`` kills no other process group and deletes no
    other directory, and says so in one line."""
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    precious = tmp_path / "precious"
    precious.mkdir()
    workdir = tmp_path / "stack"
    workdir.mkdir()
    forged = {
        "name": "postgres",
        "endpoint": "x",
        "source": "local",
        "pgid": bystander.pid,
        "command": "/x/postgres",
    }
    kept = {"name": "kafka", "endpoint": "x", "source": "local", "data_dir": str(precious)}
    state = {"owns_workdir": False, "services": {"postgres": forged, "kafka": kept}}
    (workdir / "state.json").write_text(json.dumps(state))
    try:
        down = run_stack_cli("down", "--dir", str(workdir))
        assert down.returncode == 1 and len(down.stderr.strip().splitlines()) == 1, down.stderr
        assert "not stopped" in down.stderr and "kept" in down.stderr
        assert bystander.poll() is None and precious.is_dir()
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize(
    "dsn", ["postgresql://postgres:hunter2@127.0.0.1:{port}/db", "password=hunter2 oops"]
)
def test_an_unusable_address_with_a_password_is_one_line_without_it(dsn: str, tmp_path: Path) -> None:
    env = {"SPANNER_CDC_POSTGRES_DSN": dsn.format(port=free_port())}
    up = run_stack_cli("up", "--dir", str(tmp_path / "stack"), "--services", "postgres", env=env)
    assert up.returncode == 1 and "Traceback" not in up.stderr, up.stderr
    assert "postgres: SPANNER_CDC_POSTGRES_DSN=" in up.stderr
    assert "hunter2" not in up.stdout + up.stderr


def test_failed_start_stops_what_was_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL fails (an unreachable address is given); the broker started before it stops."""
    monkeypatch.delenv("SPANNER_CDC_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.setenv("SPANNER_CDC_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:1/postgres")
    workdir = tmp_path / "w"
    with pytest.raises(ServiceError, match=r"postgres: SPANNER_CDC_POSTGRES_DSN=.* does not answer"):
        EmbeddedStack.start(workdir, ("kafka", "postgres"))
    assert (workdir / "kafka.log").exists(), "the broker was started first"
    assert processes_running_in(workdir) == []


def test_the_embedded_broker_is_apache_kafka_of_the_pinned_version(stack: EmbeddedStack) -> None:
    """The broker the stack runs says it is Apache Kafka, of the version ``jvm/kafka/pom.xml``
    pins, a KRaft node keeping its data on disk; and it answers a request only a broker of Kafka
    4 serves (KIP-848's consumer group protocol)."""
    pinned = re.search(r"<kafka.version>([^<]+)</kafka.version>", (ROOT / "jvm/kafka/pom.xml").read_text())
    assert pinned is not None
    assert f"kafka_2.13-{pinned[1]}.jar" in {jar.name for jar in jars("kafka")}
    handle = stack.services["kafka"]
    assert handle.source == "local"
    log = (stack.workdir / "kafka" / "server.log").read_text()
    assert f"Kafka version: {pinned[1]}" in log
    assert "KafkaRaftServer nodeId=1] Kafka Server started" in log
    assert (stack.workdir / "kafka" / "data" / "meta.properties").is_file()

    topic = f"kip848-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": handle.endpoint})
    producer.produce(topic, b"v")
    assert producer.flush(30) == 0
    consumer = Consumer(
        {"bootstrap.servers": handle.endpoint, "group.id": topic, "group.protocol": "consumer",
         "auto.offset.reset": "earliest"}
    )  # fmt: skip
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        message = None
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(1.0)
        assert message is not None and message.error() is None and message.value() == b"v"
    finally:
        consumer.close()
