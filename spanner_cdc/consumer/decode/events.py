"""Events of one writer schema: a share's messages read into Arrow columns, judged by the rules,
made events.

Every event a task reads comes this way: its bytes are read once, by the compiled steps,
straight into the columns of :func:`gate_type` (``avro_steps.ColumnsReader``: no Python record
is made), its table version is looked up once per key, the rules (consumer.decode.rules) are
Arrow expressions over those columns, and the sinks take the accepted events' rows from the
same columns (change_rows). A message the reader cannot read fails its part of the share and
names itself (``message_index``): it is refused with the reason its exception gives, and the
messages around it are read again without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spanner_cdc.consumer.decode.change_rows import event_type
from spanner_cdc.consumer.decode.decoded import OFFSET, PARTITION, TOPIC, DecodedEvent
from spanner_cdc.consumer.decode.kafka_rows import kafka_column
from spanner_cdc.consumer.decode.rules import SORT_KEY_ITEM, EventRows, broken_rules
from spanner_cdc.consumer.decode.table_version import TableVersion, payload_columns
from spanner_cdc.schemas.avro_steps import ColumnsReader
from spanner_cdc.schemas.errors import ContractError, DecodeError
from spanner_cdc.schemas.topics import Topics
from spanner_cdc.schemas.wire import WriterSchema, body_error

#: Messages read by one call of the columns reader: a call that fails on one message is made
#: again for the messages after it, so the part bounds what one bad message costs.
READ_PART = 1_024
#: Joins a key's column names into one value to group events by; a name holding it (no valid
#: name does: rules.check_name) is looked up event by event.
_NAME_JOINER = "\x00"

VersionLookup = Callable[[WriterSchema, tuple[str, ...]], TableVersion]


def gate_type(writer: WriterSchema) -> pa.StructType:
    """What is read of an event of ``writer``: every part the sinks take
    (``change_rows.event_type`` over the writer's payload) and the sort keys the rules check."""
    values = pa.struct([(column.field, column.type.arrow) for column in payload_columns(writer)])
    return pa.struct([*event_type(values), ("sort_keys", pa.list_(SORT_KEY_ITEM))])


@dataclass(frozen=True)
class Messages:
    """Messages of one writer schema: their rows' numbers in the share, the Avro bytes each is
    read from (a JSON event's are those it stands for) and where its body starts."""

    positions: np.ndarray
    bodies: list[bytes]
    starts: list[int]

    @classmethod
    def joined(cls, parts: list[Messages]) -> Messages:
        if len(parts) == 1:
            return parts[0]
        return cls(
            np.concatenate([part.positions for part in parts]),
            [body for part in parts for body in part.bodies],
            [start for part in parts for start in part.starts],
        )

    def each(self) -> Iterator[Messages]:
        """Each message alone."""
        for i in range(len(self.bodies)):
            yield Messages(self.positions[i : i + 1], self.bodies[i : i + 1], self.starts[i : i + 1])


@dataclass(frozen=True)
class EventsRead:
    """What :meth:`EventReader.read` made of :class:`Messages`: the events and their rows'
    numbers, in the messages' order, and each refused message's row number and reason."""

    events: list[DecodedEvent]
    positions: np.ndarray
    refused: list[tuple[int, DecodeError]]


class EventReader:
    """Reads the events of a share under the batch's context: its topics, its clock and the
    table version of a writer schema and key (``gate.MessageReader.version``)."""

    def __init__(self, topics: Topics, now_micros: int, version: VersionLookup) -> None:
        self.topics = topics
        self.now_micros = now_micros
        self._version = version
        self._readers: dict[int, ColumnsReader | DecodeError] = {}

    def read(self, writer: WriterSchema, messages: Messages, rows: pa.RecordBatch | pa.Table) -> EventsRead:
        """``messages`` of ``writer``, at their positions of ``rows`` (the Kafka columns)."""
        reader = self._reader(writer)
        if isinstance(reader, DecodeError):
            return EventsRead([], np.empty(0, np.int64), [(int(p), reader) for p in messages.positions])
        read, columns, refused = _readable(reader, messages)
        if columns is None:
            return EventsRead([], np.empty(0, np.int64), _at(messages, refused))
        numbers, versions, unversioned = self._versions(
            writer, columns.field("source_metadata").field("primary_keys")
        )
        refused.extend((int(read[row]), error) for row, error in unversioned)
        read, columns, numbers = _without([row for row, _ in unversioned], read, columns, numbers)
        at = pa.array(messages.positions[read])
        columns = _with_coordinates(columns, rows, at)
        judged = EventRows(columns, columns.field(TOPIC), tuple(versions), numbers)
        broken = broken_rules(judged, self.topics, self.now_micros)
        refused.extend((int(read[row]), error) for row, error in broken.items())
        read, columns, numbers = _without(list(broken), read, columns, numbers)
        at = pa.array(messages.positions[read])
        events = _events(rows, at, columns, [versions[n] for n in numbers.to_pylist()])
        return EventsRead(events, messages.positions[read], _at(messages, refused))

    def _reader(self, writer: WriterSchema) -> ColumnsReader | DecodeError:
        """The reader of :func:`gate_type` for ``writer``, once per writer; the reason its
        messages are refused where the writer's schema is not an event's."""
        known = self._readers.get(writer.fingerprint)
        if known is None:
            try:
                known = ColumnsReader(writer.column_reader, gate_type(writer))
            except (TypeError, ContractError) as exc:
                known = DecodeError("not-an-event", f"decodes, but is not a change event: {exc}")
            self._readers[writer.fingerprint] = known
        return known

    def _versions(
        self, writer: WriterSchema, primary_keys: pa.Array
    ) -> tuple[pa.Array, list[TableVersion], list[tuple[int, DecodeError]]]:
        """Each event's table version, as a number into the list returned (null where the lookup
        refuses its key, with the row and the reason in the last list). Looked up once per key:
        the events are grouped by their keys' names joined."""
        groups = pc.dictionary_encode(pc.binary_join(primary_keys, _NAME_JOINER))
        lengths = pc.list_value_length(primary_keys).to_numpy(zero_copy_only=False)
        versions: list[TableVersion] = []
        numbers: dict[tuple[str, ...], int | DecodeError] = {}
        of_row = np.full(len(primary_keys), -1, np.int64)
        refused: list[tuple[int, DecodeError]] = []
        for rows in grouped(groups.indices.to_numpy(zero_copy_only=False)):
            first = tuple(primary_keys[int(rows[0])].as_py())
            if any(_NAME_JOINER in name for name in first) or np.any(lengths[rows] != len(first)):
                each = [
                    (rows[i : i + 1], tuple(primary_keys[int(row)].as_py())) for i, row in enumerate(rows)
                ]
            else:  # the same names: no name holds the joiner, and as many of them
                each = [(rows, first)]
            for chosen, names in each:
                if names not in numbers:
                    try:
                        versions.append(self._version(writer, names))
                        numbers[names] = len(versions) - 1
                    except DecodeError as exc:
                        numbers[names] = exc
                found = numbers[names]
                if isinstance(found, DecodeError):
                    refused.extend((int(row), found) for row in chosen)
                else:
                    of_row[chosen] = found
        return pa.array(of_row, pa.int32(), mask=of_row < 0), versions, refused


def grouped(codes: np.ndarray) -> Iterator[np.ndarray]:
    """The numbers of the rows of each code in ``codes`` (ascending within a code), a code at a
    time: one sort, not a scan of every row per code."""
    order = np.argsort(codes, kind="stable")
    bounds = np.flatnonzero(np.diff(codes[order])) + 1
    yield from (part for part in np.split(order, bounds) if len(part))


def _readable(
    reader: ColumnsReader, messages: Messages
) -> tuple[np.ndarray, pa.StructArray | None, list[tuple[int, DecodeError]]]:
    """``messages`` read into columns in parts of at most :data:`READ_PART`: the numbers (into
    ``messages``) of those read, their columns (None: none read), and each unread one's number
    and reason. A
    message the reader cannot read fails its part's call and names itself (``message_index``):
    the messages before it are read again, and reading goes on after it."""
    read: list[np.ndarray] = []
    parts: list[pa.StructArray] = []
    refused: list[tuple[int, DecodeError]] = []
    start, end = 0, len(messages.bodies)
    while start < end:
        stop = min(start + READ_PART, end)
        try:
            parts.append(reader(messages.bodies[start:stop], messages.starts[start:stop]))
        except Exception as exc:  # the message's bytes provoked it: its reason, not the batch's
            failed = getattr(exc, "message_index", None)
            if not isinstance(failed, int) or not 0 <= failed < stop - start:
                raise
            if failed:
                parts.append(
                    reader(messages.bodies[start : start + failed], messages.starts[start : start + failed])
                )
                read.append(np.arange(start, start + failed))
            refused.append((start + failed, _unreadable(exc)))
            start += failed + 1
        else:
            read.append(np.arange(start, stop))
            start = stop
    if not parts:
        return np.empty(0, np.int64), None, refused
    return np.concatenate(read), parts[0] if len(parts) == 1 else pa.concat_arrays(parts), refused


def _unreadable(exc: BaseException) -> DecodeError:
    """Why a message's bytes could not be read: ``schemas.wire.body_error``'s reasons, and a
    value the sinks' column cannot hold (a NUMERIC of 38 digits or more) as ``bad-value``."""
    if isinstance(exc, OverflowError):
        return DecodeError("bad-value", f"{type(exc).__name__}: {exc}")
    return body_error(exc)


def _with_coordinates(
    columns: pa.StructArray, rows: pa.RecordBatch | pa.Table, at: pa.Array
) -> pa.StructArray:
    """``columns`` with the topic, partition and offset of their rows (``at``, of ``rows``)."""
    added = [kafka_column(rows, name).take(at) for name in ("topic", "partition", "offset")]
    fields = [
        *columns.type,
        pa.field(TOPIC, pa.string()),
        pa.field(PARTITION, pa.int32()),
        pa.field(OFFSET, pa.int64()),
    ]
    own = [columns.field(index) for index in range(columns.type.num_fields)]
    return pa.StructArray.from_arrays(
        [*own, *(a.cast(f.type) for a, f in zip(added, fields[-3:], strict=True))], fields=fields
    )


def _without(
    dropped: list[int], read: np.ndarray, columns: pa.StructArray, numbers: pa.Array
) -> tuple[np.ndarray, pa.StructArray, pa.Array]:
    """``read``, ``columns`` and ``numbers`` (one row each per event) without the rows ``dropped``."""
    if not dropped:
        return read, columns, numbers
    kept = np.setdiff1d(np.arange(len(read)), np.array(dropped, np.int64))
    taken = pa.array(kept)
    return read[kept], columns.take(taken), numbers.take(taken)


def _at(messages: Messages, refused: list[tuple[int, DecodeError]]) -> list[tuple[int, DecodeError]]:
    """``refused`` numbered by their rows (not by their place among ``messages``)."""
    return [(int(messages.positions[number]), error) for number, error in refused]


def _events(
    rows: pa.RecordBatch | pa.Table, at: pa.Array, columns: pa.StructArray, version_of: list[TableVersion]
) -> list[DecodedEvent]:
    """The accepted events, at positions ``at`` of ``rows``, each a row of ``columns``, of table
    version ``version_of``: Kafka coordinates, key and bytes, table version, table, sort key
    (source_metadata's, which the sort keys equal) and their row of ``columns``."""
    kafka = [columns.field(name).to_pylist() for name in (TOPIC, PARTITION, OFFSET)]
    kafka += [kafka_column(rows, name).take(at).to_pylist() for name in ("key", "value")]
    metadata = columns.field("source_metadata")
    sort_keys = zip(
        pc.cast(metadata.field("commit_timestamp"), pa.int64()).to_pylist(),
        pc.fill_null(metadata.field("tx_id"), "").to_pylist(),
        pc.fill_null(metadata.field("record_sequence"), "").to_pylist(),
        metadata.field("mod_index").to_pylist(),
        strict=True,
    )
    return [
        DecodedEvent(topic, partition, offset, key, value, version, table, sort_key, columns, row)
        for row, (topic, partition, offset, key, value, version, table, sort_key) in enumerate(
            zip(
                *kafka,
                version_of,
                columns.field("object").to_pylist(),
                sort_keys,
                strict=True,
            )
        )
    ]
