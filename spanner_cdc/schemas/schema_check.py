"""Is a writer schema one the contract could have produced? Checked before a reader uses it.

Anyone who can write to ``_spanner-cdc.{prefix}.schemas`` can publish a schema, and a reader that trusts it
can be made to crash (a recursive schema segfaults fastavro's reader), to spin (an array of
``null`` decodes millions of items from a few bytes) or to misread (types the sinks have no
mapping for). So every schema is walked once, with bounds, before it is used:

- JSON of at most :data:`MAX_SCHEMA_BYTES`, nesting at most :data:`MAX_DEPTH`, at most
  :data:`MAX_FIELDS` fields in all — written, and as a decoder expands them: a named type used
  twice counts twice, so a few kilobytes of records each using the previous one twice (work
  doubling per level) are refused, and every count is memoised per named type;
- every named type defined once, and no two with the same short name (a reader resolving a
  name, and this check, must find the same definition: a decoy ``Payload`` is refused);
- only the types the contract writes: records, arrays, maps, unions, the primitives, and the
  logical types of ``spanner_types``; no ``enum``, no ``fixed``, no named type used inside its
  own definition (recursion);
- no array item or map value that can be encoded in zero bytes (``null``, an empty record),
  so a decoder reads at most one item per byte of the message;
- an event schema has every field of ``avsc/envelope.avsc`` with the contract's type (more
  fields are allowed: a newer producer may add some), and its ``Payload`` is a record of
  nullable columns of mapped types; a key schema (``avsc/key.avsc``) is such a record too; a
  watermark schema is the contract's own.

A schema that fails is rejected with a :class:`SchemaRejectedError` naming the rule.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from spanner_cdc.schemas.errors import ContractError
from spanner_cdc.schemas.spanner_types import NUMERIC_PRECISION, NUMERIC_SCALE
from spanner_cdc.schemas.table import PAYLOAD_TYPE_NAME, load_avsc
from spanner_cdc.schemas.watermark import WATERMARK_SCHEMA

MAX_SCHEMA_BYTES = 1 << 20
MAX_DEPTH = 16
#: Spanner allows 1,024 columns per table; payload and old values hold them twice, plus the envelope.
MAX_FIELDS = 4_096
PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
#: The one decimal the contract writes: Spanner's NUMERIC.
NUMERIC_DECIMAL = (NUMERIC_PRECISION, NUMERIC_SCALE)
#: logicalType → the primitive it annotates, as ``spanner_types`` writes them.
LOGICAL_TYPES = {
    "decimal": "bytes",
    "json": "string",
    "number": "string",
    "uuid": "string",
    "date": "int",
    "timestamp-micros": "long",
    "timestamp-millis": "long",
}
_ENVELOPE = load_avsc("envelope.avsc")
_KEY = load_avsc("key.avsc")


class SchemaRejectedError(ContractError):
    """A writer schema the contract could not have produced; ``str()`` says which rule."""


def check_writer_schema(text: str) -> dict[str, Any]:
    """The parsed schema, or SchemaRejectedError."""
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise SchemaRejectedError(f"schema of {len(text.encode()):,} bytes (at most {MAX_SCHEMA_BYTES:,})")
    try:
        schema = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise SchemaRejectedError(f"not JSON: {exc}") from None
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise SchemaRejectedError("the top level is not a record")
    walk = _Walk()
    walk.type(schema, depth=0, defining=())
    expanded = walk.expanded_fields(schema)
    if expanded > MAX_FIELDS:
        raise SchemaRejectedError(
            f"{expanded:,} fields once named types are expanded (at most {MAX_FIELDS:,})"
        )
    if schema.get("name") == WATERMARK_SCHEMA["name"]:
        if _bare(schema) != _bare(WATERMARK_SCHEMA):
            raise SchemaRejectedError("a watermark schema that is not the contract's")
    elif schema.get("name") == _ENVELOPE["name"]:
        _check_envelope(schema, walk.resolve(PAYLOAD_TYPE_NAME))
    elif schema.get("name") == _KEY["name"]:
        _check_columns(schema)  # the message key's schema: the key columns, as the payload's
    else:
        raise SchemaRejectedError(f"record {schema.get('name')!r:.80} is not an event, key or watermark")
    return schema


class _Walk:
    """One pass over a schema: types allowed, bounds kept, no recursion."""

    def __init__(self) -> None:
        self.fields = 0
        self.defined: dict[str, Any] = {}
        #: Named type → whether a value of it can take zero bytes / its fields expanded (memos).
        self._empty: dict[str, bool] = {}
        self._expanded: dict[str, int] = {}

    def type(self, avro: Any, depth: int, defining: tuple[str, ...]) -> None:
        if depth > MAX_DEPTH:
            raise SchemaRejectedError(f"nested deeper than {MAX_DEPTH}")
        if isinstance(avro, str):
            self._named(avro, defining)
        elif isinstance(avro, list):
            if not avro:
                raise SchemaRejectedError("an empty union")
            for branch in avro:
                self.type(branch, depth + 1, defining)
        elif isinstance(avro, dict):
            self._complex(avro, depth, defining)
        else:
            raise SchemaRejectedError(f"not a type: {avro!r:.80}")

    def _named(self, name: str, defining: tuple[str, ...]) -> None:
        if name in PRIMITIVES:
            return
        if any(name == own or own.endswith(f".{name}") for own in defining):
            raise SchemaRejectedError(f"type {name!r} is used inside its own definition (recursion)")
        if not any(name == known or known.endswith(f".{name}") for known in self.defined):
            raise SchemaRejectedError(f"type {name!r} is not defined before its use")

    def _complex(self, avro: dict[str, Any], depth: int, defining: tuple[str, ...]) -> None:
        kind = avro.get("type")
        if kind == "record":
            self._record(avro, depth, defining)
        elif kind == "array":
            self._repeated(avro.get("items"), depth, defining, "array items")
        elif kind == "map":
            self._repeated(avro.get("values"), depth, defining, "map values")
        elif isinstance(kind, str) and kind in PRIMITIVES:
            logical = avro.get("logicalType")
            if logical is not None and LOGICAL_TYPES.get(logical) != kind:
                raise SchemaRejectedError(
                    f"logical type {logical!r} on {kind!r} is not one the contract writes"
                )
            if logical == "decimal" and (avro.get("precision"), avro.get("scale", 0)) != NUMERIC_DECIMAL:
                raise SchemaRejectedError(
                    f"decimal({avro.get('precision')!r:.20}, {avro.get('scale', 0)!r:.20}) is not the "
                    f"contract's decimal{NUMERIC_DECIMAL}"
                )
        else:
            raise SchemaRejectedError(f"type {kind!r:.40} is not one the contract writes")

    def _record(self, avro: dict[str, Any], depth: int, defining: tuple[str, ...]) -> None:
        name, fields = avro.get("name"), avro.get("fields")
        if not isinstance(name, str) or not isinstance(fields, list):
            raise SchemaRejectedError("a record without a name or a field list")
        namespace = avro.get("namespace")
        full = f"{namespace}.{name}" if isinstance(namespace, str) and "." not in name else name
        short = full.rsplit(".", 1)[-1]
        if any(known.rsplit(".", 1)[-1] == short for known in self.defined):
            raise SchemaRejectedError(f"a second type named {short!r:.80}")
        self.fields += len(fields)
        if self.fields > MAX_FIELDS:
            raise SchemaRejectedError(f"more than {MAX_FIELDS} fields")
        names = set()
        for field in fields:
            if not isinstance(field, dict) or not isinstance(field.get("name"), str):
                raise SchemaRejectedError(f"record {name!r}: a field without a name")
            if field["name"] in names:
                raise SchemaRejectedError(f"record {name!r}: field {field['name']!r} twice")
            names.add(field["name"])
            self.type(field.get("type"), depth + 1, (*defining, full))
        self.defined[full] = avro

    def _repeated(self, items: Any, depth: int, defining: tuple[str, ...], what: str) -> None:
        self.type(items, depth + 1, defining)
        if self._may_be_empty(items):
            raise SchemaRejectedError(f"{what} that can be encoded in zero bytes")

    def _may_be_empty(self, avro: Any) -> bool:
        """Can a value of this type take zero bytes (so a count alone could mean endless items)?"""
        if avro == "null" or (isinstance(avro, dict) and avro.get("type") == "null"):
            return True
        if isinstance(avro, str) and avro in self._empty:
            return self._empty[avro]
        record = self.resolve(avro)
        empty = (
            record is not None
            and record.get("type") == "record"
            and all(self._may_be_empty(f.get("type")) for f in record.get("fields", []))
        )
        if isinstance(avro, str):
            self._empty[avro] = empty
        return empty

    def expanded_fields(self, avro: Any) -> int:
        """The record fields a decoder walks for one value of this type, named types expanded
        where they are used (each counted once per use; memoised per name)."""
        if isinstance(avro, list):
            return sum(self.expanded_fields(branch) for branch in avro)
        if isinstance(avro, str):
            if avro in PRIMITIVES:
                return 0
            if avro not in self._expanded:
                self._expanded[avro] = self.expanded_fields(self.resolve(avro))
            return self._expanded[avro]
        if not isinstance(avro, dict):
            return 0
        kind = avro.get("type")
        if kind == "record":
            fields = avro.get("fields", [])
            return len(fields) + sum(self.expanded_fields(f.get("type")) for f in fields)
        if kind == "array":
            return self.expanded_fields(avro.get("items"))
        if kind == "map":
            return self.expanded_fields(avro.get("values"))
        return 0

    def resolve(self, avro: Any) -> dict[str, Any] | None:
        """A type's definition: itself, or the record a name refers to (None when unknown)."""
        if isinstance(avro, dict):
            return avro
        if isinstance(avro, str):
            return next((d for k, d in self.defined.items() if k == avro or k.endswith(f".{avro}")), None)
        return None


def _check_envelope(schema: dict[str, Any], payload: dict[str, Any] | None) -> None:
    """Every contract field, with the contract's type; the payload a record of nullable columns."""
    fields = {f["name"]: f for f in schema["fields"]}
    for expected in _ENVELOPE["fields"]:
        name = expected["name"]
        found = fields.get(name)
        if found is None:
            raise SchemaRejectedError(f"event schema without the field {name!r}")
        if name == "payload":
            if not _is_payload(found["type"]):
                raise SchemaRejectedError("payload is not the Payload record")
        elif name == "source_metadata":
            _check_source_metadata(found["type"], expected["type"])
        elif _bare(found["type"]) != _bare(expected["type"]):
            raise SchemaRejectedError(f"field {name!r} has type {found['type']!r:.80}, not the contract's")
    if payload is None or payload.get("type") != "record":
        raise SchemaRejectedError("event schema without a Payload record")
    _check_columns(payload)


def _is_payload(avro: Any) -> bool:
    """The Payload record, by name or defined in place (the first reference defines it)."""
    name = avro.get("name") if isinstance(avro, dict) else avro
    return isinstance(name, str) and name.split(".")[-1] == PAYLOAD_TYPE_NAME


def _check_source_metadata(found: Any, expected: dict[str, Any]) -> None:
    if not isinstance(found, dict) or found.get("type") != "record":
        raise SchemaRejectedError("source_metadata is not a record")
    fields = {f["name"]: f for f in found["fields"]}
    for wanted in expected["fields"]:
        name = wanted["name"]
        if name not in fields:
            raise SchemaRejectedError(f"source_metadata without the field {name!r}")
        kind = fields[name]["type"]
        if name == "old_values":
            if not (isinstance(kind, list) and len(kind) == 2 and kind[0] == "null" and _is_payload(kind[1])):
                raise SchemaRejectedError("old_values is not a nullable Payload")
        elif _bare(kind) != _bare(wanted["type"]):
            raise SchemaRejectedError(f"source_metadata.{name} is not of the contract's type")


def _check_columns(record: dict[str, Any]) -> None:
    """A payload or key record: each field a nullable column of a type the sinks map, under a
    column name no other field has — compared ignoring case, as Spanner and DuckDB compare
    names (``V`` and ``v`` would be one replica column) — and without ``~``, which the replica's
    shortened names use."""
    seen: dict[str, str] = {}
    for field in record["fields"]:
        sql_name = field.get("sqlName", field["name"])
        if isinstance(sql_name, str):
            if "~" in sql_name:
                raise SchemaRejectedError(f"payload column {sql_name!r:.80} has a '~' in its name")
            folded = sql_name.casefold()
            if folded in seen:
                raise SchemaRejectedError(
                    f"payload columns {seen[folded]!r:.80} and {sql_name!r:.80} are one name"
                )
            seen[folded] = sql_name
        column = field["type"]
        if not (isinstance(column, list) and len(column) == 2 and column[0] == "null"):
            raise SchemaRejectedError(f"payload column {field['name']!r} is not a union of null and one type")
        if "sqlName" in field and not isinstance(field["sqlName"], str):
            raise SchemaRejectedError(f"payload column {field['name']!r} has a sqlName that is not text")
        for leaf in _leaves(column[1]):
            if leaf not in PRIMITIVES - {"null"} and leaf not in LOGICAL_TYPES:
                raise SchemaRejectedError(
                    f"payload column {field['name']!r} has a type the sinks cannot hold"
                )


def _leaves(avro: Any) -> Iterator[str]:
    """The scalar types of a column: itself, or its array's elements (nullable)."""
    if isinstance(avro, dict) and avro.get("type") == "array":
        items = avro["items"]
        for branch in items if isinstance(items, list) else [items]:
            if branch != "null":
                yield from _leaves(branch)
    elif isinstance(avro, dict):
        yield str(avro.get("logicalType") or avro.get("type"))
    else:
        yield str(avro)


_NOT_IN_THE_BYTES = frozenset({"doc", "default", "order", "aliases"})


def reading_form(schema: dict[str, Any]) -> str:
    """What a reader relies on, as text: everything but docs and defaults (``sqlName`` and
    ``logicalType`` included, which Avro's fingerprint leaves out). Two schemas with one
    fingerprint and different reading forms would be read differently."""
    return json.dumps(_bare(schema), sort_keys=True, separators=(",", ":"))


def without_docs(avro: Any) -> Any:
    """A schema without its ``doc`` texts: free text outside the fingerprint and the reading
    form, which a flood could make megabytes long; decoding never needs it."""
    if isinstance(avro, list):
        return [without_docs(branch) for branch in avro]
    if isinstance(avro, dict):
        return {key: without_docs(value) for key, value in avro.items() if key != "doc"}
    return avro


def _bare(avro: Any) -> Any:
    """A type (or field) without documentation, defaults or ordering hints: they change no byte."""
    if isinstance(avro, list):
        return [_bare(branch) for branch in avro]
    if isinstance(avro, dict):
        return {key: _bare(value) for key, value in avro.items() if key not in _NOT_IN_THE_BYTES}
    return avro
