"""The global thread: keeps the process's global stores equal to their topics.

Kafka Streams' `GlobalStreamThread`, for this runtime: one thread with its
own consumer (`assign()` of every partition of every global table's topic,
never the group), which first reads each partition up to the end offset it
had when the thread started (*bootstrap*: `App.start` waits for it, so no
task processes a record before the global tables are loaded), then keeps
applying what arrives while the app runs. A record with a null key is
skipped; a null value deletes the key. Under exactly_once_v2 the consumer
reads committed records only; the global stores are not part of the app's
transactions (as in Kafka Streams).

Positions: every `flush_interval_s` (the app's `commit.interval.ms`) and at
the end the databases are synced and `<global dir>/.checkpoint` names the
next offset of each partition they hold, so a restart reads only what came
after (a store whose database is new starts from the topic's beginning). A
checkpointed offset the topic no longer has (deleted, recreated) falls back
to the earliest offset (`auto.offset.reset=earliest`): the store then keeps
keys the topic may have deleted meanwhile (Kafka Streams wipes the store).

Threads: `start_and_bootstrap` by the thread calling `App.start`; `run` is
the thread itself (the only user of its consumer and the only writer of the
stores); `figures` any thread (racy reads); `request_stop`/`close_stores`
by the supervisor thread at take-down, the stores only once no processing
thread reads them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from runtime.logging import get_logger
from runtime.state.changelog_reading import sort_changelog_messages
from runtime.state.checkpoint import Offsets, checkpoint_path, read_checkpoint, write_checkpoint
from runtime.state.global_store import GlobalStore, open_rocksdb_global_store
from runtime.state.task_lock import TaskDirectoryLock

log = get_logger("runtime.state.global")

_BATCH = 2000
_POLL_S = 0.1
_LAG_EVERY_S = 1.0
_METADATA_TIMEOUT_S = 10.0


class GlobalStoreError(RuntimeError):
    """A global store could not be opened or loaded (the message says what to do)."""


class GlobalStreamThread(threading.Thread):
    """The app's global thread (see the module doc)."""

    def __init__(
        self,
        name: str,
        consumer_config: dict[str, Any],
        tables: Sequence[tuple[str, str]],
        directory: Path,
        memory: Any = None,
        flush_interval_s: float = 30.0,
    ) -> None:
        """`tables`: `(store, topic)` of each global table; `directory`: this
        process's global directory (`runtime.state.global_store.global_directory`)."""
        super().__init__(name=name, daemon=True)
        self._consumer_config = consumer_config
        self._tables = list(tables)
        self.directory = directory
        self._memory = memory
        self._flush_interval_s = flush_interval_s
        self._lock = TaskDirectoryLock(directory)
        self.stores: dict[str, GlobalStore] = {}
        self._store_of_topic: dict[str, GlobalStore] = {}
        self._positions: Offsets = {}
        self._ends: Offsets = {}  # bootstrap targets, then the latest high watermarks
        self._bootstrapped = threading.Event()
        self._stop_requested = threading.Event()
        self.state = "created"  # restoring, running, stopped, failed (racy reads)
        self.failure: BaseException | None = None
        self.bootstrap_seconds: float | None = None

    # --- the caller of App.start --------------------------------------------------

    def start_and_bootstrap(self) -> None:
        """Open the stores, start the thread and wait until every global table
        is read to the end it had now (Kafka Streams' start blocks the same
        way). Raises GlobalStoreError (the thread then ended) on failure."""
        self._open_stores()
        self.start()
        while not self._bootstrapped.wait(0.5):
            if not self.is_alive():
                self.failure = self.failure or RuntimeError("the global thread ended")
                break
        if self.failure is not None:
            self.join(timeout=30)
            self.close_stores()
            raise GlobalStoreError(f"global tables could not be loaded: {self.failure}")

    def _open_stores(self) -> None:
        if not self._lock.try_acquire():
            raise GlobalStoreError(
                f"{self.directory} is locked by another process: every process needs its "
                "own global store copy; give each instance its own state.dir"
            )
        try:
            for store, topic in self._tables:
                opened = open_rocksdb_global_store(store, topic, self.directory, self._memory)
                self.stores[store] = opened
                self._store_of_topic[topic] = opened
        except BaseException:
            self.close_stores()
            raise

    # --- the thread -----------------------------------------------------------------

    def run(self) -> None:
        consumer: Consumer | None = None
        try:
            self.state = "restoring"
            started = time.monotonic()
            consumer = Consumer(self._consumer_config)
            self._assign(consumer)
            self._load(consumer)
            self._checkpoint()
            self.bootstrap_seconds = time.monotonic() - started
            self.state = "running"
            log.info(
                "global_stores_loaded",
                stores=sorted(self.stores),
                seconds=round(self.bootstrap_seconds, 3),
                records={s.name: s.records_applied for s in self.stores.values()},
            )
            self._bootstrapped.set()
            self._keep_up(consumer)
            self._checkpoint()
            self.state = "stopped"
        except BaseException as exc:
            self.failure = exc
            self.state = "failed"
            log.error("global_thread_failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            self._bootstrapped.set()
            if consumer is not None:
                consumer.close()

    def request_stop(self) -> None:
        self._stop_requested.set()

    def _assign(self, consumer: Consumer) -> None:
        saved = read_checkpoint(checkpoint_path(self.directory)) or {}
        assignment: list[TopicPartition] = []
        for topic, store in self._store_of_topic.items():
            metadata = consumer.list_topics(topic, timeout=_METADATA_TIMEOUT_S).topics.get(topic)
            if metadata is None or metadata.error is not None or not metadata.partitions:
                raise GlobalStoreError(
                    f"global table topic {topic!r} (store {store.name!r}) does not exist: "
                    "create it before starting the app"
                )
            for partition in sorted(metadata.partitions):
                tp = (topic, partition)
                offset = None if store.created else saved.get(tp)
                if offset is not None:
                    self._positions[tp] = offset
                _, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=_METADATA_TIMEOUT_S
                )
                self._ends[tp] = high
                assignment.append(
                    TopicPartition(topic, partition, OFFSET_BEGINNING if offset is None else offset)
                )
        consumer.assign(assignment)

    def _load(self, consumer: Consumer) -> None:
        """Read until every partition reached its end as of the start (or
        reported its end: under read_committed the last offsets may be
        transaction markers or an open transaction)."""
        pending = {tp for tp, end in self._ends.items() if self._positions.get(tp, 0) < end}
        while pending:
            if self._stop_requested.is_set():
                raise GlobalStoreError("stopped while loading the global tables")
            reached = self._poll_once(consumer)
            pending = {
                tp
                for tp in pending
                if tp not in reached and self._positions.get(tp, 0) < self._ends[tp]
            }

    def _keep_up(self, consumer: Consumer) -> None:
        last_flush = last_lag = time.monotonic()
        while not self._stop_requested.is_set():
            self._poll_once(consumer)
            now = time.monotonic()
            if now - last_lag >= _LAG_EVERY_S:
                last_lag = now
                for topic, partition in list(self._ends):
                    _, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), cached=True
                    )
                    if high >= 0:
                        self._ends[(topic, partition)] = high
            if now - last_flush >= self._flush_interval_s:
                last_flush = now
                self._checkpoint()

    def _poll_once(self, consumer: Consumer) -> set[tuple[str, int]]:
        """Apply one batch; returns the partitions that reported their end."""
        messages = consumer.consume(_BATCH, timeout=_POLL_S)
        if not messages:
            return set()
        batch = sort_changelog_messages(messages)
        for tp, records in batch.records.items():
            self._store_of_topic[tp[0]].apply(records)
        self._positions.update(batch.next_offsets)
        reached = set()
        for tp, end in batch.reached_end:
            reached.add(tp)
            if end > self._positions.get(tp, 0):
                self._positions[tp] = end
        for message in messages:
            error = message.error()
            if error is not None and error.code() == KafkaError._AUTO_OFFSET_RESET:
                log.warning("global_position_reset", topic=message.topic(), error=error.str())
        return reached

    def _checkpoint(self) -> None:
        for store in self.stores.values():
            store.sync()
        write_checkpoint(checkpoint_path(self.directory), dict(self._positions))

    # --- take-down and status ---------------------------------------------------------

    def close_stores(self) -> None:
        """Close the stores and release the directory (once no thread reads them)."""
        for store in self.stores.values():
            try:
                store.close()
            except Exception as exc:  # the others still close
                log.warning("global_store_close_failed", store=store.name, error=str(exc))
        self.stores.clear()
        self._store_of_topic.clear()
        self._lock.release()

    def figures(self) -> dict[str, dict[str, Any]]:
        """Per global store: state, topic, lag (records behind the latest end
        seen), records applied, bootstrap seconds. Racy reads, any thread."""
        out: dict[str, dict[str, Any]] = {}
        positions, ends = dict(self._positions), dict(self._ends)
        for store in list(self.stores.values()):
            lag = sum(
                max(0, end - positions.get(tp, 0))
                for tp, end in ends.items()
                if tp[0] == store.topic
            )
            out[store.name] = {
                "state": self.state,
                "topic": store.topic,
                "lag": lag,
                "records": store.records_applied,
                "bootstrap_seconds": self.bootstrap_seconds,
            }
        return out
