"""Event identity and order: the deterministic uuid and ``sort_keys``.

A uuid derived from the change's identity (not random) is what makes at-least-once delivery
safe: a change re-read after a producer restart gets the same uuid, and the consumer drops it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from json.encoder import encode_basestring_ascii
from typing import Any

import uuid_utils

#: Fixed namespace for every uuid this project derives; changing it would break dedupe.
#: uuid5 as the standard defines it, from ``uuid_utils`` (in Rust): several times faster than the
#: standard library's, and every event needs one.
EVENT_NAMESPACE = uuid_utils.uuid5(
    uuid_utils.NAMESPACE_URL, "https://github.com/spanner-cdc/spanner-cdc/event"
)
_SEPARATOR = "\x1f"
#: One encoder for every key: ``json.dumps`` with options builds a new one per call, most of a
#: row id's time (the same text).
_CANONICAL_JSON = json.JSONEncoder(separators=(",", ":"), sort_keys=True, default=str)

SortKeys = list[str | int]


def change_uuid(stream_name: str, server_transaction_id: str, record_sequence: str, mod_index: int) -> str:
    """uuid of one mod of one data change record (unique across partitions and re-reads)."""
    name = _SEPARATOR.join([stream_name, server_transaction_id, record_sequence, str(mod_index)])
    return str(uuid_utils.uuid5(EVENT_NAMESPACE, name))


def backfill_uuid(
    stream_name: str, snapshot_timestamp_micros: int, table: str, key: Mapping[str, Any]
) -> str:
    """uuid of a snapshot row: the same snapshot of the same row always gets the same uuid."""
    name = _SEPARATOR.join([stream_name, str(snapshot_timestamp_micros), table, _canonical_key(key)])
    return str(uuid_utils.uuid5(EVENT_NAMESPACE, name))


def polled_uuid(stream_name: str, stamp_micros: int, table: str, key: Mapping[str, Any]) -> str:
    """uuid of a row version found by commit-timestamp polling: the row's key and the value of
    its commit-timestamp column (at most one version of a key has a given commit timestamp), so
    a version polled again after a restart gets the same uuid. Marked apart from backfill uuids,
    whose parts have the same shape."""
    name = _SEPARATOR.join(["poll", stream_name, str(stamp_micros), table, _canonical_key(key)])
    return str(uuid_utils.uuid5(EVENT_NAMESPACE, name))


def row_id(table: str, key: Mapping[str, Any]) -> str:
    """Stable id of one row of one table (the changelog's ``change$row_id``): same key, same id."""
    return str(uuid_utils.uuid5(EVENT_NAMESPACE, _SEPARATOR.join(["row", table, _canonical_key(key)])))


def _canonical_key(key: Mapping[str, Any]) -> str:
    """``key`` as JSON, names sorted, no spaces, ASCII, what JSON lacks as its ``str()`` — the
    text :data:`_CANONICAL_JSON` makes of it, built here per item: the encoder sets itself up on
    every call, which costs more than the key's text; the consumer makes an id per new key.
    ``tests/unit/schemas/test_wire_and_identity.py`` checks the ids against ``json.dumps``'s text."""
    if len(key) == 1:  # most keys: no sort, no join
        ((name, value),) = key.items()
        return f"{{{encode_basestring_ascii(name)}:{_json_value(value)}}}"
    items = ",".join(
        f"{encode_basestring_ascii(name)}:{_json_value(value)}" for name, value in sorted(key.items())
    )
    return f"{{{items}}}"


def _json_value(value: Any) -> str:
    """One value as :data:`_CANONICAL_JSON` writes it: keys' usual types spelled here (text,
    integers, booleans, null, floats), every other through the encoder."""
    kind = type(value)
    if kind is str:
        return str(encode_basestring_ascii(value))
    if kind is int:
        return int.__repr__(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if kind is float:
        if math.isfinite(value):
            return float.__repr__(value)
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    return _CANONICAL_JSON.encode(value)


def sort_keys(
    commit_timestamp_micros: int, server_transaction_id: str, record_sequence: str, mod_index: int
) -> SortKeys:
    """``[commit_timestamp_micros, server_transaction_id, record_sequence, mod_index]``.

    Changes to one key never share a commit timestamp unless they are in one transaction, where
    record_sequence and the mod index order them, so comparing element-wise orders a key's
    changes exactly as Spanner applied them.
    """
    return [commit_timestamp_micros, server_transaction_id, record_sequence, mod_index]
