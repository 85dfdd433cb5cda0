"""The shared producer's transactions under exactly_once_v2.

One transactional producer per process; one transaction covers everything
every task produced since the last commit (outputs, changelog records) plus
the input offsets, sent with the consumer's group metadata so that a member
of an older group generation cannot commit. Used by the polling thread only.

The transactional.id is stable per instance: it is kept in the state
directory, so an instance restarted on the same state fences its own zombie
(`init_transactions` aborts what the dead process left open).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from runtime.logging import get_logger

log = get_logger("runtime.transactions")

_ID_FILE = ".transactional-id"


def stable_transactional_id(app_dir: Path, application_id: str) -> str:
    """The instance's transactional.id, created once and kept in `app_dir`."""
    path = app_dir / _ID_FILE
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


class Transactions:
    """Begin lazily, commit with offsets, abort; recreate a fenced producer."""

    def __init__(self, make_producer: Callable[[], Producer], timeout_s: float) -> None:
        self._make_producer = make_producer
        self._timeout_s = timeout_s
        self.producer = self._new_producer()
        self.open = False
        self.committed = 0
        self.aborted = 0

    def _new_producer(self) -> Producer:
        producer = self._make_producer()
        # Fences any earlier producer with our transactional.id and aborts
        # the transaction it left open.
        producer.init_transactions(self._timeout_s)
        return producer

    def ensure_open(self) -> None:
        """Begin a transaction unless one is open (before any produce)."""
        if not self.open:
            self.producer.begin_transaction()
            self.open = True

    def commit(self, offsets: list[TopicPartition], group_metadata: Any) -> None:
        """Send the offsets and commit. Raises TransactionFailed after aborting."""
        if not self.open and not offsets:
            return
        self.ensure_open()
        try:
            if offsets:
                self.producer.send_offsets_to_transaction(offsets, group_metadata, self._timeout_s)
            self._commit_with_retries()
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            log.warning("transaction_commit_failed", error=error.str(), code=error.name())
            raise self.abort(error) from exc
        self.open = False
        self.committed += 1

    def _commit_with_retries(self) -> None:
        deadline = time.monotonic() + self._timeout_s * 3
        while True:
            try:
                self.producer.commit_transaction(self._timeout_s)
                return
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                # A retriable error (a timeout while the broker is slow or
                # paused) leaves the commit's outcome to a retry, which the
                # client makes idempotent.
                if error.retriable() and time.monotonic() < deadline:
                    log.warning("transaction_commit_retry", error=error.str())
                    continue
                raise

    def abort(self, cause: KafkaError | None = None) -> TransactionFailed:
        """Abort the open transaction (recreating a fenced or broken producer)."""
        recreated = False
        error = cause or KafkaError(KafkaError._STATE, "aborted by the runtime")
        if self.open:
            try:
                if error.fatal():
                    raise KafkaException(error)
                self.producer.abort_transaction(self._timeout_s)
            except KafkaException as exc:
                log.warning("transaction_abort_failed", error=str(exc))
                self._replace_producer()
                recreated = True
        self.open = False
        self.aborted += 1
        return TransactionFailed(error, recreated)

    def _replace_producer(self) -> None:
        """A fatal producer error (fenced, epoch bumped after a timeout):
        start over with a new producer, which fences the old one."""
        with contextlib.suppress(Exception):  # the old producer is unusable anyway
            self.producer.flush(0)
        self.producer = self._new_producer()
        log.info("transactional_producer_recreated")
