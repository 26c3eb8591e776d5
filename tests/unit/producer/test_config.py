"""Option resolution, catalog type parsing and query text: the producer's pure parts."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from spanner_cdc.common.config import ConfigError, add_options, resolve
from spanner_cdc.common.logs import configure as configure_logging
from spanner_cdc.producer.change_stream_rules import refuse_partition_mode, validate_stream_name
from spanner_cdc.producer.changestream.actions import TableFilter
from spanner_cdc.producer.config import PRODUCE_OPTIONS, ProducerConfig
from spanner_cdc.producer.errors import SpannerSetupError
from spanner_cdc.producer.spanner.catalog import TableCatalog, parse_catalog_type
from spanner_cdc.producer.spanner.query import ChangeStreamQuery
from spanner_cdc.producer.spanner.whole_rows import partial_payloads
from spanner_cdc.schemas.errors import UnsupportedTypeError
from spanner_cdc.schemas.spanner_types import SpannerType

pytestmark = pytest.mark.unit
REQUIRED = [
    "--project",
    "p",
    "--instance",
    "i",
    "--database",
    "d",
    "--change-stream",
    "S",
    "--kafka-bootstrap",
    "k:1",
]


def parse(argv: list[str]) -> dict[str, object]:
    parser = argparse.ArgumentParser(prog="spanner-cdc produce")
    add_options(parser, PRODUCE_OPTIONS)
    return resolve(parser.parse_args(argv), PRODUCE_OPTIONS, "produce")


def test_precedence_cli_over_env_over_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[produce]\nheartbeat_ms = 3000\nmax-queries = 7\ninclude_tables = ["A", "B*"]\n')
    monkeypatch.setenv("SPANNER_CDC_HEARTBEAT_MS", "4000")
    values = parse([*REQUIRED, "--config", str(config)])
    assert (
        values["heartbeat_ms"] == 4000
        and values["max_queries"] == 7
        and values["include_tables"] == ["A", "B*"]
    )
    assert parse([*REQUIRED, "--config", str(config), "--heartbeat-ms", "5000"])["heartbeat_ms"] == 5000


def test_defaults_and_repeated_options() -> None:
    values = parse([*REQUIRED, "--kafka-config", "security.protocol=SSL", "--kafka-config", "a=b"])
    assert values["kafka_config"] == [("security.protocol", "SSL"), ("a", "b")]
    assert values["heartbeat_ms"] == 2000 and values["end_timestamp"] is None


def test_client_settings_keep_their_commas_and_come_one_per_line_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="p,w";'
    given = parse([*REQUIRED, "--kafka-config", f"sasl.jaas.config={jaas}", "--kafka-config", "a=1,2"])
    assert given["kafka_config"] == [("sasl.jaas.config", jaas), ("a", "1,2")]
    monkeypatch.setenv("SPANNER_CDC_KAFKA_CONFIG", "sasl.password=p,w\nsecurity.protocol=SASL_SSL\n")
    assert parse(REQUIRED)["kafka_config"] == [("sasl.password", "p,w"), ("security.protocol", "SASL_SSL")]


@pytest.mark.parametrize("value", ["sasl.password", "hunter2", "=hunter2"])
def test_a_refused_client_setting_is_not_echoed(value: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse([*REQUIRED, "--kafka-config", value])
    assert "--kafka-config" in str(refused.value)
    assert "hunter2" not in str(refused.value)


@pytest.mark.parametrize(
    ("given", "progress"),
    [([], True), (["--progress"], True), (["--no-progress"], False), (["--progress", "false"], False)],
)
def test_switches_need_no_value(given: list[str], progress: bool) -> None:
    assert parse([*REQUIRED, *given])["progress"] is progress


def test_kafka_tools_spelling_of_the_bootstrap_servers_is_accepted() -> None:
    without = REQUIRED[: REQUIRED.index("--kafka-bootstrap")]
    assert parse([*without, "--bootstrap-server", "h:9"])["kafka_bootstrap"] == "h:9"


def test_heartbeat_interval_down_to_100_ms_and_the_stall_limit_never_under_5_s() -> None:
    assert parse([*REQUIRED, "--heartbeat-ms", "100"])["heartbeat_ms"] == 100
    with pytest.raises(ConfigError, match=r"--heartbeat-ms: invalid value '99'"):
        parse([*REQUIRED, "--heartbeat-ms", "99"])
    config = ProducerConfig.from_options(parse([*REQUIRED, "--heartbeat-ms", "100"]))
    assert config.stall_seconds == 5.0, "10 intervals of 100 ms would restart queries after 1 s"
    slow = ProducerConfig.from_options(
        parse([*REQUIRED, "--heartbeat-ms", "2000", "--stall-heartbeats", "3"])
    )
    assert slow.stall_seconds == 6.0


def test_errors_name_the_source() -> None:
    with pytest.raises(ConfigError, match=r"--heartbeat-ms: invalid value '99999999'"):
        parse([*REQUIRED, "--heartbeat-ms", "99999999"])
    with pytest.raises(ConfigError, match="--database is required"):
        parse(["--project", "p", "--instance", "i"])


@pytest.mark.parametrize("name", ["Bank", "_s1", "a" * 128])
def test_valid_stream_names(name: str) -> None:
    assert validate_stream_name(name) == name


@pytest.mark.parametrize("name", ["", "1abc", "Bank; DROP TABLE x", 'x"y', "a b", "a" * 129, "Bank)--"])
def test_stream_names_that_could_inject_sql_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="not a valid identifier"):
        validate_stream_name(name)


def test_query_text_per_dialect() -> None:
    google = ChangeStreamQuery("Bank", "GOOGLE_STANDARD_SQL", 1000, None)
    assert google.sql.startswith("SELECT ChangeRecord FROM READ_Bank(")
    params, _ = google.params(None, 0)
    assert params["token"] is None and params["heartbeat"] == 1000 and params["end"] is None
    postgres = ChangeStreamQuery("bank", "POSTGRESQL", 2000, 5)
    assert postgres.sql == 'SELECT * FROM "spanner"."read_json_bank"($1, $2, $3, $4, null)'
    assert list(postgres.params("t", 0)[0]) == ["p1", "p2", "p3", "p4"]


@pytest.mark.parametrize(
    ("text", "dialect", "expected"),
    [
        ("STRING(MAX)", "GOOGLE_STANDARD_SQL", SpannerType("STRING")),
        ("ARRAY<BYTES(10)>", "GOOGLE_STANDARD_SQL", SpannerType("ARRAY", None, SpannerType("BYTES"))),
        ("PROTO<a.B>", "GOOGLE_STANDARD_SQL", SpannerType("PROTO")),
        ("numeric", "POSTGRESQL", SpannerType("NUMERIC", "PG_NUMERIC")),
        ("character varying(36)", "POSTGRESQL", SpannerType("STRING")),
        ("bigint[]", "POSTGRESQL", SpannerType("ARRAY", None, SpannerType("INT64"))),
        ("spanner.commit_timestamp", "POSTGRESQL", SpannerType("TIMESTAMP")),
    ],
)
def test_catalog_types(text: str, dialect: str, expected: SpannerType) -> None:
    assert parse_catalog_type(text, dialect, "T", "C") == expected


def test_unknown_catalog_type_is_an_error() -> None:
    with pytest.raises(UnsupportedTypeError, match="INTERVAL"):
        parse_catalog_type("INTERVAL", "GOOGLE_STANDARD_SQL", "T", "C")


def test_catalog_completes_partial_column_lists() -> None:
    from spanner_cdc.producer.spanner.catalog import CatalogColumn

    columns = [CatalogColumn.parse(n, p, t, "GOOGLE_STANDARD_SQL", "T") for n, p, t in
               [("Id", 1, "INT64"), ("A", 2, "STRING(MAX)"), ("B", 3, "INT64")]]  # fmt: skip
    catalog = TableCatalog("GOOGLE_STANDARD_SQL", lambda: ({"T": columns}, {}))
    catalog.refresh()
    partial = [
        {"name": "Id", "type": {"code": "INT64"}, "is_primary_key": True, "ordinal_position": 1},
        {"name": "B", "type": {"code": "INT64"}, "is_primary_key": False, "ordinal_position": 3},
    ]
    assert not catalog.needs_refresh("T", partial)
    completed = catalog.complete("T", partial)
    assert [c["name"] for c in completed] == ["Id", "A", "B"]
    assert catalog.table_schema("T", partial) is catalog.cached_schema("T", partial)
    added = [
        *partial,
        {"name": "New", "type": {"code": "BOOL"}, "is_primary_key": False, "ordinal_position": 4},
    ]
    assert catalog.needs_refresh("T", added), "a column the catalog lacks means the table changed"


@pytest.mark.parametrize(
    ("level", "ours", "theirs"),
    [
        ("debug", logging.DEBUG, logging.INFO),
        ("info", logging.INFO, logging.INFO),
        ("error", logging.ERROR, logging.ERROR),
    ],
)
@pytest.mark.usefixtures("restored_logging")
def test_log_level_sets_the_projects_loggers_and_keeps_libraries_at_info_or_above(
    level: str, ours: int, theirs: int
) -> None:
    configure_logging("text", level)
    assert logging.getLogger("spanner_cdc.producer.spanner.change_stream").getEffectiveLevel() == ours
    assert logging.getLogger("py4j.clientserver").getEffectiveLevel() == theirs


def test_table_filters_name_the_patterns_that_select_nothing() -> None:
    tables = ["Accounts", "AuditLog", "finance.Ledger"]
    assert TableFilter(("Acc*", "Acounts"), ("Audit*", "Tmp*")).unmatched(tables) == ["Acounts", "Tmp*"]


@pytest.mark.parametrize(
    ("mode", "refused"),
    [
        (None, False),
        ("IMMUTABLE_KEY_RANGE", False),
        ("MUTABLE_KEY_RANGE", True),
        ("'mutable_key_range'", True),
    ],
)
def test_streams_with_mutable_key_ranges_are_refused_at_start(mode: str | None, refused: bool) -> None:
    if refused:
        with pytest.raises(SpannerSetupError, match="'S' has partition_mode = 'MUTABLE_KEY_RANGE'"):
            refuse_partition_mode("S", mode)
    else:
        refuse_partition_mode("S", mode)


@pytest.mark.parametrize(
    ("capture", "lacking"),
    [
        ("NEW_ROW_AND_OLD_VALUES", None),
        ("NEW_ROW", "with value_capture_type NEW_ROW a DELETE carries only the key"),
        (None, "with value_capture_type OLD_AND_NEW_VALUES an UPDATE carries only the changed columns"),
        ("NEW_VALUES", "with value_capture_type NEW_VALUES an UPDATE carries only the changed columns "
         "and a DELETE carries only the key"),
    ],
)  # fmt: skip
def test_what_a_capture_type_leaves_out_of_the_payload(capture: str | None, lacking: str | None) -> None:
    """None is Spanner's default, OLD_AND_NEW_VALUES."""
    assert partial_payloads(capture) == lacking


def test_a_backfill_snapshot_needs_backfill_and_a_past_time() -> None:
    def config(*extra: str) -> ProducerConfig:
        return ProducerConfig.from_options(parse([*REQUIRED, *extra]))

    made = config("--backfill", "--backfill-snapshot", "2026-01-02T03:04:05.000006Z")
    assert made.backfill_snapshot_micros == 1_767_323_045_000_006
    assert config().backfill_snapshot_micros is None
    with pytest.raises(ConfigError, match="give --backfill too"):
        config("--backfill-snapshot", "2026-01-02T03:04:05Z")
    with pytest.raises(ConfigError, match="in the future"):
        config("--backfill", "--backfill-snapshot", "2999-01-01T00:00:00Z")
    with pytest.raises(ConfigError, match="--backfill-snapshot"):
        config("--backfill", "--backfill-snapshot", "now")
