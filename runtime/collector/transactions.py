"""The shared producer's transactions under exactly_once_v2.

One transactional producer per process; one transaction covers everything
every task produced since the last commit (outputs, changelog records) plus
the input offsets, sent with the consumer's group metadata so that a member
of an older group generation cannot commit. Used by the polling thread only.

The transactional.id is stable per instance: it is kept in the state
directory, so an instance restarted on the same state fences its own zombie
(`init_transactions` aborts what the dead process left open).

The calls that wait on a coordinator (`send_offsets_to_transaction`,
`commit_transaction`, `abort_transaction`) run on a short-lived helper thread
with a hard deadline: librdkafka can block in `send_offsets_to_transaction`
far past its timeout when the group coordinator moved to another broker
(confluentinc/librdkafka#5456 and #5511: the coordinator lookup is never
retried; seen here for 160 s when one node coordinating both the transaction
and the group was killed). A call past its deadline leaves its producer stuck;
it is abandoned (kept referenced until the call returns) and replaced by a new
one with the same transactional.id, which fences it and aborts its transaction.
A call that times out in time (a coordinator moving to another node) is retried
instead, for a bounded time: librdkafka resumes it where it was.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from runtime.kafka.broker_health import Retrying
from runtime.logging import get_logger

log = get_logger("runtime.transactions")

_ID_FILE = ".transactional-id"


def stable_transactional_id(app_dir: Path, application_id: str, slot: int = -1) -> str:
    """The instance's transactional.id, created once and kept in `app_dir`.

    `slot`: the processing process's slot under `processes` > 1 (`process.slot`);
    each slot keeps its own id (`.transactional-id-p<slot>`), so a restarted
    slot fences its own zombie. Slot 0 and a one-process daemon (-1) share the
    old file: going from one process to several keeps the id of the first."""
    path = app_dir / (_ID_FILE if slot <= 0 else f"{_ID_FILE}-p{slot}")
    try:
        existing = path.read_text().strip()
        if existing:
            return existing
    except FileNotFoundError:
        pass
    app_dir.mkdir(parents=True, exist_ok=True)
    value = f"{application_id}-{uuid.uuid4()}"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(value + "\n")
    tmp.replace(path)
    return value


class TransactionFailed(Exception):
    """The transaction was aborted: the caller must rewind every task."""

    def __init__(self, error: KafkaError, recreated_producer: bool) -> None:
        super().__init__(error.str())
        self.error = error
        self.recreated_producer = recreated_producer


# Producer errors after which the transactional producer is unusable: it was
# fenced (another producer initialised our transactional.id, or the
# coordinator bumped our epoch) or hit another fatal error.
_BROKEN_CODES = (KafkaError._FENCED, KafkaError._FATAL)


# How long past its own timeout a coordinator call may block before its
# producer is abandoned as stuck (see the module docstring).
_STUCK_GRACE_S = 5.0

# How long a new producer keeps retrying `init_transactions` after timeouts
# before the polling thread gives up (the app then fails). While the node that
# coordinates our transactional.id is down, the role moves only once the
# controller notices (broker.session.timeout.ms, 9 s by default) and the new
# coordinator has loaded its log: one call's timeout (10 s) was not enough on a
# three-node cluster (tests/integration/test_eos_failover.py). Kafka Streams
# gives the same call `task.timeout.ms` (5 min); this blocks the polling thread,
# so it stays below the consumer's max.poll.interval.ms default (300 s).
INIT_RETRY_BUDGET_S = 120.0


class ProducerStuck(KafkaException):
    """A transactional call did not return by its deadline; the producer is abandoned."""


def call_with_deadline(name: str, call: Callable[[], None], deadline_s: float) -> None:
    """Run `call` on a helper thread; raise ProducerStuck if it is still running
    after `deadline_s` (it then keeps running, and keeps its producer alive)."""
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome.append(exc)

    worker = threading.Thread(target=run, name=f"txn-{name}", daemon=True)
    worker.start()
    worker.join(deadline_s)
    if worker.is_alive():
        raise ProducerStuck(
            KafkaError(
                KafkaError._TIMED_OUT,
                f"{name} did not return within {deadline_s:.0f} s "
                "(librdkafka#5456: a moved coordinator is not looked up again); "
                "the producer is replaced",
            )
        )
    if outcome:
        raise outcome[0]


def breaks_producer(error: KafkaError) -> bool:
    """Whether `error` leaves a transactional producer unusable (fenced, fatal)."""
    return bool(error.fatal()) or error.code() in _BROKEN_CODES


class Transactions:
    """Begin lazily, commit with offsets, abort; recreate a fenced producer.

    A fenced (or otherwise fatally failed) producer is reported through
    `note_broken` (from its error callback or a failed `produce()`): from then
    on nothing is produced, the next `commit` aborts, and `abort` replaces the
    producer. A transaction the broker refused a record of is reported
    through `note_doomed`: it cannot commit either, but `abort_transaction`
    ends it and the producer stays. Either way the polling thread then
    rewinds every task (`broken` tells it not to wait for the commit
    interval).
    """

    def __init__(
        self,
        make_producer: Callable[[], Producer],
        timeout_s: float,
        stuck_grace_s: float = _STUCK_GRACE_S,
        init_budget_s: float = INIT_RETRY_BUDGET_S,
        retrying: Retrying | None = None,
    ) -> None:
        self._make_producer = make_producer
        self._retrying = retrying if retrying is not None else Retrying()
        self._timeout_s = timeout_s
        self._stuck_grace_s = stuck_grace_s
        self._init_budget_s = init_budget_s
        self.producer = self._new_producer()
        self.open = False
        self.committed = 0
        self.aborted = 0
        self.broken: KafkaError | None = None
        """The error that ended the open transaction, if any: a fatal one
        (the producer is replaced on abort) or a refused record (doomed)."""
        self._fatal = False  # `broken` made the producer unusable (not just doomed)
        self._stuck = False  # a call on the current producer overran its deadline

    @property
    def unusable(self) -> bool:
        """Whether `broken` is fatal (fenced, stuck): the producer must go."""
        return self._fatal

    @property
    def timeout_s(self) -> float:
        """The transaction timeout (s): an open transaction must end sooner."""
        return self._timeout_s

    def note_broken(self, error: KafkaError) -> None:
        """The producer is fenced or failed fatally: abort and replace it next."""
        if not self._fatal:
            log.warning("transactional_producer_broken", error=error.str(), code=error.name())
            self.broken = error
            self._fatal = True

    def note_doomed(self, error: KafkaError) -> None:
        """The broker refused a record of the open transaction (librdkafka
        then refuses every `produce()` with `_STATE` until it is aborted):
        abort it next, keeping the producer. Polling thread, or a
        transactional call's helper thread while the polling thread waits."""
        if self.broken is None:
            log.warning("transaction_doomed", error=error.str(), code=error.name())
            self.broken = error

    def _new_producer(self) -> Producer:
        """A producer whose `init_transactions` succeeded: it fences any earlier
        producer with our transactional.id and ends the transaction that one
        left open (aborted, or committed if its commit had already begun).

        A timeout is retried on the same producer (librdkafka resumes the
        call) until `INIT_RETRY_BUDGET_S` has passed: a coordinator that is
        moving to another node is a broker outage to ride out, not a reason to
        stop the app. Each retry is logged. A fatal error starts over with a
        new producer; anything else, or the budget spent, raises.
        """
        deadline = time.monotonic() + self._init_budget_s
        producer = self._make_producer()
        try:
            while True:
                try:
                    producer.init_transactions(self._timeout_s)
                    return producer
                except KafkaException as exc:
                    error: KafkaError = exc.args[0]
                    if time.monotonic() >= deadline or not (error.retriable() or error.fatal()):
                        raise
                    log.warning(
                        "transactional_producer_init_retry",
                        error=error.str(),
                        code=error.name(),
                        new_producer=bool(error.fatal()),
                    )
                    self._retrying.note("init_transactions")
                    if error.fatal():
                        producer = self._make_producer()
        finally:
            self._retrying.clear()

    def ensure_open(self) -> bool:
        """Begin a transaction unless one is open (before any produce).

        False if the producer is broken: nothing may be produced until the
        transaction is aborted (the records are recomputed after the rewind).
        """
        if self.broken is not None:
            return False
        if not self.open:
            try:
                self.producer.begin_transaction()
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if not breaks_producer(error):
                    raise
                self.note_broken(error)
                self.open = True  # what was produced before must still be aborted
                return False
            self.open = True
        return True

    def commit(self, offsets: list[TopicPartition], group_metadata: Any) -> None:
        """Send the offsets and commit. Raises TransactionFailed after aborting."""
        if self.broken is not None:
            raise self.abort(self.broken)
        if not self.open and not offsets:
            return
        self.ensure_open()
        if self.broken is not None:
            raise self.abort(self.broken)
        try:
            if offsets:
                self._bounded(
                    "send_offsets_to_transaction",
                    partial(
                        self.producer.send_offsets_to_transaction,
                        offsets,
                        group_metadata,
                        self._timeout_s,
                    ),
                )
            self._retried(
                "commit_transaction", self.producer.commit_transaction, self._timeout_s * 3
            )
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            log.warning("transaction_commit_failed", error=error.str(), code=error.name())
            raise self.abort(error) from exc
        self.open = False
        self.committed += 1

    def _retried(self, name: str, call: Callable[[float], None], budget_s: float) -> None:
        """A coordinator call, retried after a retriable error (a timeout while
        a broker is slow, paused or moving its coordinator role) for `budget_s`:
        librdkafka resumes the call where it was, so a retried commit or abort
        happens once. A stuck call (past its deadline) is never retried."""
        deadline = time.monotonic() + budget_s
        try:
            while True:
                try:
                    self._bounded(name, partial(call, self._timeout_s))
                    return
                except KafkaException as exc:
                    error: KafkaError = exc.args[0]
                    if (
                        error.retriable()
                        and not isinstance(exc, ProducerStuck)
                        and time.monotonic() < deadline
                    ):
                        log.warning("transaction_call_retry", call=name, error=error.str())
                        self._retrying.note(name)
                        continue
                    raise
        finally:
            self._retrying.clear()

    def abort(self, cause: KafkaError | None = None) -> TransactionFailed:
        """Abort the open transaction (recreating a fenced or broken producer)."""
        recreated = False
        error = cause or self.broken or KafkaError(KafkaError._STATE, "aborted by the runtime")
        if self.open or self.broken is not None:
            try:
                if self._fatal or breaks_producer(error):
                    raise KafkaException(error)
                # Past the retries the producer is replaced instead: its
                # init_transactions ends the transaction.
                self._retried(
                    "abort_transaction", self.producer.abort_transaction, self._timeout_s * 2
                )
            except KafkaException as exc:
                log.warning("transaction_abort_failed", error=str(exc))
                self._replace_producer()
                recreated = True
        self.open = False
        # A doomed transaction is over once aborted; the producer carries on.
        self.broken = None
        self.aborted += 1
        return TransactionFailed(error, recreated)

    def replace_producer(self) -> None:
        """Start over with a new producer built from the (changed) settings,
        e.g. a lower `message.max.bytes` after a topic's limit was lowered.
        Only between transactions (after an abort or a commit)."""
        if self.open:
            raise RuntimeError("replace_producer with a transaction open")
        self._replace_producer()

    def _bounded(self, name: str, call: Callable[[], None]) -> None:
        """A coordinator call with a hard deadline; a stuck producer is marked
        broken so that the abort replaces it instead of calling it again."""
        try:
            call_with_deadline(name, call, self._timeout_s + self._stuck_grace_s)
        except ProducerStuck as exc:
            self._stuck = True
            self.note_broken(exc.args[0])
            raise

    def _replace_producer(self) -> None:
        """A fatal producer error (fenced, epoch bumped after a timeout, stuck):
        start over with a new producer, which fences the old one."""
        if not self._stuck:
            with contextlib.suppress(Exception):  # the old producer is unusable anyway
                self.producer.flush(0)
        # A stuck producer stays referenced by its call's thread until it returns.
        self._stuck = False
        self.producer = self._new_producer()
        # Errors the old producer reported (served by the flush above) are about it.
        self.broken = None
        self._fatal = False
        log.info("transactional_producer_recreated")
