"""Every message of the producer inside a Kafka transaction, so that a second process writing to
the same topic prefix fences the first (docs/scale-out.md).

The prefix has one transactional id, ``_spanner-cdc.{prefix}.writer``. A process takes it over
when it starts (``init_transactions``): the broker aborts the previous holder's open transaction
and refuses whatever that holder sends afterwards — PRODUCER_FENCED, which stops it with one
line (:func:`lost_for_good`). Messages go into the open transaction, which is committed and a
new one begun every :data:`TRANSACTION_SECONDS` (sooner when a message's commit is awaited:
``KafkaClient.produce_acknowledged``).

A message counts as delivered — its ``on_delivery`` runs, so acknowledgement trackers, hence
checkpoints and watermarks, move — only once its transaction committed: the broker's
acknowledgement of a message inside a transaction promises nothing if the transaction is then
aborted, and a transaction that commits delivered every message of it. So librdkafka reports
failures only (``delivery.report.only.error``, which the producer's writers set): the writer
keeps the open transaction's *batches* — messages produced with one ``on_delivery``, one after
the other (a partition run's events for one table's topic) — and reports each batch once when it
commits, instead of being handed a report per message by librdkafka; a failure reports its
batch once, whichever message failed.
Once every message of the open transaction was answered by the broker, each batch is *staged*
(``on_staged``: delivered exactly if the transaction commits) and the writer asks its
``closing`` function for records the transaction carries too —
the checkpoints of what it delivers (producer.shards.transaction_checkpoints) — so events and
the checkpoint covering them commit together. A commit Kafka has not confirmed yet is resumed, for up to
:data:`COMMIT_PATIENCE_SECONDS`. When a commit fails, the transaction is aborted and each of its
messages — and each message kept for the next one — reports the commit's error (a partition then
restarts from its checkpoint, as after any failed delivery).

Before a commit the writer waits for the broker's answers, flushing librdkafka on a worker
thread — which sends at once what ``linger.ms`` would hold back — and the commit then blocks for
the broker's round trips, so it runs on a worker thread too. From the start of a commit
to its end librdkafka takes no new messages for the transaction: they are kept, in order, and
sent into the next one — about :data:`MAX_DEFERRED` at most, then the event loop waits, as it
waits when librdkafka's own queue is full.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from spanner_cdc.producer.errors import KafkaClientLostError

log = logging.getLogger(__name__)
#: A delivery report: the error (None: delivered) and the message — librdkafka's for a failure
#: it reported, None for what is reported at a commit (delivered, or failed with the commit).
DeliveryCallback = Callable[[KafkaError | None, Message | None], None]
#: Called once a message is in the open transaction for good: delivered exactly if it commits.
StagedCallback = Callable[[], None]
#: What the producer's writers set: librdkafka reports a message only when it failed.
FAILURES_ONLY = {"delivery.report.only.error": True}


@dataclass(frozen=True)
class ClosingRecord:
    """A record a transaction carries with it, made just before it commits: a checkpoint that
    is true exactly when the transaction's events are delivered."""

    topic: str
    key: bytes
    value: bytes
    partition: int
    on_delivery: DeliveryCallback


#: One message of a batch: key, value (None: a tombstone) and what the batch's ``on_refused``
#: is handed back to name it (any object: the writer does not look at it).
Outbound = tuple[bytes, bytes | None, Any]
#: Called, with the message and librdkafka's reason, for a message of a batch that librdkafka
#: refused as it was produced because it is larger than ``message.max.bytes``: the rest of the
#: batch goes on. Without one, the refusal is raised.
RefusedCallback = Callable[[Outbound, str], None]
#: The records to add to the open transaction right before it commits (see TransactionalWriter).
ClosingRecords = Callable[[], list[ClosingRecord]]
#: How often the open transaction is committed: the delay a transaction adds before consumers
#: reading committed data see an event, and before a checkpoint can move.
TRANSACTION_SECONDS = 0.1
#: How long ``init_transactions`` and one commit or abort may take.
TRANSACTION_TIMEOUT_SECONDS = 30.0
#: How long the loop serves delivery reports at a time while it waits for a commit to end.
DRAIN_PAUSE_SECONDS = 0.002
#: How long one flush before a commit may keep a worker thread: the wait is cut into such slices
#: so that a shutdown's deadline is kept and a thread is not held past it.
FLUSH_SLICE_SECONDS = 0.05
#: How long a commit is resumed while its errors say it may be: past the broker's own
#: ``transaction.timeout.ms`` (60 s), after which the broker aborts the transaction and the
#: commit's error says so.
COMMIT_PATIENCE_SECONDS = 90.0
#: The pause before resuming a commit whose error came back at once.
COMMIT_RESUME_PAUSE_SECONDS = 0.1
#: Messages kept while a commit runs before the event loop waits for it.
MAX_DEFERRED = 100_000
#: librdkafka's "no partition given": the partitioner picks one by the key.
PARTITION_BY_KEY = -1
#: The broker's and librdkafka's ways of saying another process took the transactional id over.
FENCED = (KafkaError.PRODUCER_FENCED, KafkaError._FENCED)


def lost_for_good(error: KafkaError) -> bool:
    """Whether the producer's client will deliver nothing more: a fatal error, or fenced —
    another process took the topic prefix's transactional id over. Fencing is not flagged
    fatal by librdkafka, so a retry through the same client would fail the same way forever."""
    return error.fatal() or error.code() in (*FENCED, KafkaError._FATAL)


def client_lost(error: KafkaError) -> str:
    """The one line for a client :func:`lost_for_good` (see KafkaClientLostError)."""
    if error.code() in FENCED:
        return (
            f"another producer took over this topic prefix ({error.str()}): this one stops; "
            "one producer process per topic prefix"
        )
    return (
        f"Kafka's client failed for good ({error.str()}): run the producer again, it resumes from "
        "its checkpoints"
    )


class _Sent:
    """One batch of the open transaction: its destination, its callbacks, the messages kept
    while a commit runs, and whether it was reported. It is also librdkafka's delivery report
    for each of its messages — called for a failure (or, from a client that reports every
    message, for a delivery too, which waits for the commit like the rest)."""

    __slots__ = (
        "kept",
        "on_delivery",
        "on_refused",
        "on_staged",
        "partition",
        "reported",
        "size",
        "topic",
        "writer",
    )

    def __init__(
        self,
        writer: TransactionalWriter,
        topic: str,
        partition: int,
        on_delivery: DeliveryCallback,
        *,
        on_staged: StagedCallback | None = None,
        on_refused: RefusedCallback | None = None,
    ) -> None:
        self.writer = writer
        self.topic = topic
        self.partition = partition
        self.on_delivery = on_delivery
        self.on_staged = on_staged
        self.on_refused = on_refused
        self.kept: list[Outbound] = []
        #: Its messages, kept or handed to librdkafka (what a failed commit counts).
        self.size = 0
        self.reported = False

    def __call__(self, error: KafkaError | None, message: Message | None) -> None:
        """librdkafka's report. A delivery waits for the commit, which reports it. A failure is
        reported at once (its partition restarts from its checkpoint) and dooms the transaction
        — on the loop: one served on a worker thread (a flush, a commit) is handed to it —; a
        report for a batch already reported (another of its messages failed, or the commit
        did) is dropped: each batch is reported once."""
        if error is None:
            return
        writer = self.writer
        if threading.get_ident() != writer._loop_thread and writer._loop is not None:
            writer._loop.call_soon_threadsafe(self, error, message)
        elif not self.reported:
            self.reported = True
            writer._failed_in_transaction = True
            self.on_delivery(error, message)


class TransactionalWriter:
    """One transactional producer: messages in, commits every interval, reports after commit.

    Called from the event loop's thread only; the commit's worker thread touches nothing but the
    client, :attr:`lost` and :attr:`_commit_done`.
    """

    def __init__(self, producer: Producer, closing: ClosingRecords | None = None) -> None:
        self.producer = producer
        #: Asked, once every message of the open transaction is staged, for records the
        #: transaction carries too (the checkpoints of what it delivers).
        self.closing = closing
        self._began = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        #: Whether messages go to librdkafka; False from the start of a commit to its end.
        self._open = True
        #: Cleared while the commit itself runs on its worker thread.
        self._commit_done = threading.Event()
        self._commit_done.set()
        #: Batches kept while a commit runs, and how many messages they hold.
        self._deferred: list[_Sent] = []
        self._deferred_messages = 0
        #: The open transaction's batches, reported when it commits (or fails).
        self._in_transaction: list[_Sent] = []
        #: A message of the open transaction failed: it can only abort, and carries no checkpoint.
        self._failed_in_transaction = False
        self._commit_lock = asyncio.Lock()
        #: The error that ended the client, once one did: the reason later failures name.
        self.lost: KafkaError | None = None

    async def take_over(self) -> None:
        """Take the transactional id over (fencing its previous holder) and begin a transaction."""
        if not self._began:
            await asyncio.to_thread(self._begin)

    def _begin(self) -> None:
        try:
            self.producer.init_transactions(TRANSACTION_TIMEOUT_SECONDS)
            self.producer.begin_transaction()
        except KafkaException as exc:
            raise KafkaClientLostError(client_lost(exc.args[0])) from None
        self._began = True

    def produce(
        self,
        topic: str,
        key: bytes,
        value: bytes | None,
        on_delivery: DeliveryCallback,
        partition: int = PARTITION_BY_KEY,
        *,
        on_staged: StagedCallback | None = None,
    ) -> None:
        """Queue one message: a batch of one (see :meth:`produce_batch`)."""
        self.produce_batch(topic, [(key, value, None)], on_delivery, partition, on_staged=on_staged)

    def produce_batch(
        self,
        topic: str,
        messages: list[Outbound],
        on_delivery: DeliveryCallback,
        partition: int = PARTITION_BY_KEY,
        *,
        on_staged: StagedCallback | None = None,
        on_refused: RefusedCallback | None = None,
    ) -> None:
        """Queue ``messages``, in order, into the open transaction (or the next, while a commit
        runs). A batch is reported as one: ``on_staged`` runs once the broker took all of it
        in, ``on_delivery`` once its transaction committed — or once, with the error, when any
        of its messages or the commit failed. Messages produced with the ``on_delivery`` of
        the writer's latest batch (see :meth:`joins`) join that batch."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
        if not self._began:
            self._begin()  # a client used without take_over (tests, benchmarks): once, blocking
        sent = self._joinable(topic, on_delivery, partition)
        joined = sent is not None
        if sent is None:
            sent = _Sent(self, topic, partition, on_delivery, on_staged=on_staged, on_refused=on_refused)
        sent.size += len(messages)
        if not self._open:
            if self._deferred_messages >= MAX_DEFERRED:
                self._wait_for_commit()
            sent.kept += messages
            if not joined:
                self._deferred.append(sent)
            self._deferred_messages += len(messages)
            return
        if self._deferred:
            self._send_deferred()
        if not joined:
            self._in_transaction.append(sent)
        self._produce(sent, messages)

    def joins(self, topic: str, on_delivery: DeliveryCallback, partition: int = PARTITION_BY_KEY) -> bool:
        """Whether messages produced now with ``on_delivery`` would join the writer's latest
        batch, reported with it: the latest produced, to the same destination with the same
        ``on_delivery``, not reported yet, and in the transaction they would go into."""
        return self._joinable(topic, on_delivery, partition) is not None

    def _joinable(self, topic: str, on_delivery: DeliveryCallback, partition: int) -> _Sent | None:
        if self._deferred:
            latest = self._deferred[-1]
        elif self._open and self._in_transaction:
            latest = self._in_transaction[-1]
        else:
            return None
        if latest.on_delivery is on_delivery and latest.topic == topic and latest.partition == partition:
            return None if latest.reported else latest
        return None

    def _wait_for_commit(self) -> None:
        """Too many messages kept: the event loop waits, as when librdkafka's own queue is full —
        for the commit's worker thread, or, before the commit starts, serving the transaction's
        reports itself. The commit goes on at the loop's next turn."""
        if not self._commit_done.is_set():
            self._commit_done.wait()
            return
        while len(self.producer) > 0 and self.lost is None:
            self.poll(DRAIN_PAUSE_SECONDS)

    def _send_deferred(self) -> None:
        deferred, self._deferred, self._deferred_messages = self._deferred, [], 0
        for sent in deferred:
            self._in_transaction.append(sent)
            kept, sent.kept = sent.kept, []
            self._produce(sent, kept)

    def _produce(self, sent: _Sent, messages: list[Outbound]) -> None:
        """``messages`` into librdkafka, reported by ``sent``; when librdkafka's queue is full,
        serve delivery reports until it is not."""
        if self.lost is not None:
            raise KafkaClientLostError(client_lost(self.lost))
        produce, topic, partition = self.producer.produce, sent.topic, sent.partition
        for message in messages:
            while True:
                try:
                    produce(topic, message[1], message[0], partition, sent)
                    break
                except BufferError:
                    self.producer.poll(0.05)
                except KafkaException as exc:
                    error: KafkaError = exc.args[0]
                    if error.code() == KafkaError.MSG_SIZE_TOO_LARGE and sent.on_refused is not None:
                        sent.size -= 1  # no longer the batch's: on_refused settles it
                        sent.on_refused(message, error.str())
                        break
                    if lost_for_good(error):
                        raise KafkaClientLostError(client_lost(self._lose(error))) from None
                    raise

    def poll(self, timeout: float = 0) -> int:
        """Serve delivery reports (on the event loop's thread). A fatal error librdkafka raises
        here is kept as :attr:`lost`: the messages and commits that fail after it report it."""
        try:
            served: int = self.producer.poll(timeout)
        except KafkaException as exc:
            self._lose(exc.args[0])
            return 0
        return served

    async def commit(self, deadline: float | None = None, *, checkpoints: bool = False) -> int:
        """Commit the open transaction and begin the next; then report its messages delivered,
        or each with the commit's error. Returns how many messages failed. ``deadline`` (monotonic)
        bounds the wait for the transaction's delivery reports (at shutdown); the commit then
        waits for the rest itself, for at most TRANSACTION_TIMEOUT_SECONDS. With
        ``checkpoints`` a transaction with nothing else in it commits the closing records
        alone: how progress without events (heartbeats) is recorded."""
        async with self._commit_lock:
            if not self._began or (not self._in_transaction and not checkpoints):
                return 0
            self._open = False
            await self._delivered(deadline)
            if self.closing is not None and self.lost is None and not self._failed_in_transaction:
                self._staged()
                self._close_with(self.closing())
                await self._delivered(deadline)
            if not self._in_transaction:  # no record to carry either
                self._open = True
                if self._deferred:
                    self._send_deferred()
                return 0
            self._commit_done.clear()
            error = await asyncio.to_thread(self._finish)
            # Reports the worker thread handed over ran before this line (one queue, in order).
            sent, self._in_transaction = self._in_transaction, []
            self._failed_in_transaction = False
            self._open = True
            if self.lost is not None:
                error = self.lost
            held = [batch for batch in sent if not batch.reported]
            for batch in sent:
                batch.reported = True  # a failure librdkafka reports after this is dropped
            if error is None:
                if self._deferred:
                    self._send_deferred()
            else:
                # The kept messages fail with the commit: their partitions restart from the
                # checkpoint the aborted transaction did not move, and would send them again.
                held += self._deferred
                self._deferred, self._deferred_messages = [], 0
            for batch in held:
                batch.on_delivery(error, None)
            return sum(batch.size for batch in held) if error is not None else 0

    def _staged(self) -> None:
        """No message of the open transaction failed so far (each was answered, or is still on
        its way at a shutdown's deadline): each batch is delivered exactly if the transaction
        commits, which a later failure would keep from happening."""
        for batch in self._in_transaction:
            if batch.on_staged is not None:
                batch.on_staged()
                batch.on_staged = None  # once: a commit cancelled after this stages them again

    def _close_with(self, records: list[ClosingRecord]) -> None:
        """Add the closing records to the open transaction. librdkafka refuses them ("Erroneous
        state") once the transaction failed — a message timed out, its delivery report still
        on the way: the commit then aborts it, with no checkpoint in it."""
        for record in records:
            try:
                sent = _Sent(self, record.topic, record.partition, record.on_delivery)
                sent.size = 1
                self._in_transaction.append(sent)
                self._produce(sent, [(record.key, record.value, None)])
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._STATE:
                    raise
                self._failed_in_transaction = True
                return

    async def _delivered(self, deadline: float | None) -> None:
        """Wait until the broker answered every message of the transaction: librdkafka's flush,
        on a worker thread, in slices of :data:`FLUSH_SLICE_SECONDS`. While it flushes,
        librdkafka sends what it holds at once instead of after ``linger.ms``: a commit awaited
        for one message (a table's writer schemas, a partition's checkpoint) waited that long
        twice, for the transaction's messages and for its closing records (measured on the
        bench's backlog: 20-28 ms a wait before, 1.4-5.5 ms after). The reports it serves there
        are failures (the producer's writers report nothing else, :data:`FAILURES_ONLY`), handed
        to the loop by :class:`_Sent`. Bounded by ``message.timeout.ms``, after which an
        undelivered message reports its failure, or by ``deadline``. After a failure the rest
        of the transaction's messages report only once ``transaction.timeout.ms`` passed
        (docs/producer.md); the abort cannot come sooner — it waits for messages in flight, and
        given less time than that it fails the client."""
        while len(self.producer) > 0 and self.lost is None:
            wait = FLUSH_SLICE_SECONDS
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return
            error = await asyncio.to_thread(self._flush, wait)
            if error is not None:
                self._lose(error)

    def _flush(self, timeout: float) -> KafkaError | None:
        """On a worker thread: flush for at most ``timeout`` seconds; the error it raised, if any."""
        try:
            self.producer.flush(timeout)
        except KafkaException as exc:
            return exc.args[0]  # type: ignore[no-any-return]
        return None

    def _finish(self) -> KafkaError | None:
        """On a worker thread: commit (or abort) and begin the next transaction; the error.

        librdkafka's commit errors are of three kinds: retriable (the commit is still under way
        and must be resumed — an abort now would conflict with it), abortable, and fatal."""
        try:
            error = self._commit()
            if error is not None and error.txn_requires_abort():
                self.producer.abort_transaction(TRANSACTION_TIMEOUT_SECONDS)
            elif error is not None:
                return self._lose(error)
            self.producer.begin_transaction()
            return error
        except KafkaException as exc:  # the abort or the next begin failed: the client cannot go on
            return self._lose(exc.args[0])
        finally:
            self._commit_done.set()

    def _lose(self, error: KafkaError) -> KafkaError:
        """The client can send nothing more: from now on every failure reports the first reason,
        as an error :func:`lost_for_good` recognises whatever its code — or the fence, once it is
        known, since that asks the user for something else (one producer per prefix)."""
        error = self._reason(error)
        fenced = error.code() in FENCED
        if self.lost is None or (fenced and self.lost.code() not in FENCED):
            self.lost = error if fenced else KafkaError(KafkaError._FATAL, error.str(), fatal=True)
        return self.lost

    def _reason(self, error: KafkaError) -> KafkaError:
        """Once the client failed, its calls say only "Local: Fatal error"; the error that failed
        it (a fence, most often) is raised by the next poll. Polled on the event loop's thread
        only: the delivery reports it serves belong there."""
        if error.code() != KafkaError._FATAL or threading.get_ident() != self._loop_thread:
            return error
        try:
            self.producer.poll(0)
        except KafkaException as exc:
            return exc.args[0]  # type: ignore[no-any-return]
        return error

    def _commit(self) -> KafkaError | None:
        """Commit, resuming the commit while its error says it may be (a coordinator moving or
        loading, a broker not answering), for at most COMMIT_PATIENCE_SECONDS; the last error."""
        give_up = time.monotonic() + COMMIT_PATIENCE_SECONDS
        while True:
            try:
                self.producer.commit_transaction(TRANSACTION_TIMEOUT_SECONDS)
                return None
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if not error.retriable() or time.monotonic() >= give_up:
                    return error
                log.warning("Kafka has not confirmed a commit yet (%s): resuming it", error.str())
                time.sleep(COMMIT_RESUME_PAUSE_SECONDS)
