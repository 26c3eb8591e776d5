"""Events encoded by ``schemas/`` decode with the reference Apache Avro Java library.

The avro jar that ships inside pyspark's ``jars/`` is driven with the installed JDK. Java
computes the fingerprint itself, checks the single-object header, decodes every field by the
schema and re-encodes the record; matching bytes prove the encoding is standard Avro.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pyspark
import pytest

from spanner_cdc.schemas.events import EventBuilder
from spanner_cdc.schemas.records import DataChangeRecord
from spanner_cdc.schemas.wire import HEADER_LENGTH, WriterSchema, encode
from testkit.records import STREAM_NAME, account_transfer_records
from tests.unit.schemas.test_wire_and_identity import all_types_event_value

pytestmark = pytest.mark.integration

JAVA_SOURCE = Path(__file__).resolve().parent.parent / "interop" / "AvroSingleObjectCheck.java"
SPARK_JARS = Path(pyspark.__file__).resolve().parent / "jars"


@pytest.fixture(scope="module")
def java_checker(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    javac, java = shutil.which("javac"), shutil.which("java")
    assert javac and java, "a JDK 17 is needed (make test installs openjdk-17-jdk-headless)"
    assert list(SPARK_JARS.glob("avro-1.*.jar")), f"no avro jar in {SPARK_JARS}"
    classes = tmp_path_factory.mktemp("java")
    classpath = f"{SPARK_JARS}/*"
    subprocess.run([javac, "-cp", classpath, "-d", str(classes), str(JAVA_SOURCE)], check=True)
    return [java, "-cp", f"{classes}:{classpath}", "AvroSingleObjectCheck"]


def java_decode(
    checker: list[str], tmp_path: Path, schema_json: str, messages: list[bytes]
) -> list[list[str]]:
    schema_file = tmp_path / "schema.avsc"
    schema_file.write_text(schema_json)
    messages_file = tmp_path / "messages.hex"
    messages_file.write_text("".join(m.hex() + "\n" for m in messages))
    result = subprocess.run(
        [*checker, str(schema_file), str(messages_file)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return [line.split("\t", 2) for line in result.stdout.splitlines()]


def assert_java_agrees(
    checker: list[str], tmp_path: Path, schema: dict[str, object], records: list[dict[str, object]]
) -> list[str]:
    writer = WriterSchema.from_schema(schema)
    messages = [encode(writer, record) for record in records]
    lines = java_decode(checker, tmp_path, writer.schema_json, messages)
    assert len(lines) == len(messages)
    for (fingerprint, reencoded, _), message in zip(lines, messages, strict=True):
        assert fingerprint.rjust(16, "0") == writer.fingerprint_hex
        assert reencoded == message[HEADER_LENGTH:].hex()
    return [rendered for _, _, rendered in lines]


def test_every_type_decodes_in_java(java_checker: list[str], tmp_path: Path) -> None:
    table, value = all_types_event_value()
    [rendered] = assert_java_agrees(java_checker, tmp_path, table.event_schema, [value])
    assert str(value["uuid"]) in rendered and "ünïcødé" in rendered


def test_transfer_events_and_keys_decode_in_java(java_checker: list[str], tmp_path: Path) -> None:
    builder = EventBuilder(STREAM_NAME, "bank")
    events = [
        event
        for record in account_transfer_records()
        for event in builder.build(DataChangeRecord.from_json(record), "p", 1_664_281_800_200)
    ]
    table = events[0].table
    rendered = assert_java_agrees(java_checker, tmp_path, table.event_schema, [e.value for e in events])
    assert '"Balance": 1000' in rendered[0] and '"Balance": 2000' in rendered[1]
    keys = assert_java_agrees(java_checker, tmp_path, table.key_schema, [e.key for e in events])
    assert keys == ['{"AccountId": "Id1"}', '{"AccountId": "Id2"}']
