"""`StandbyUpdates`: the standbys the restoration thread keeps current.

Each standby's changelog partitions are assigned on the restore consumer from
its checkpoint (or the beginning); their records are applied as they come,
a position the changelog does not have wipes the store and starts it again
from the changelog's start, and every standby is checkpointed every few
seconds and when it is dropped. Its positions and its lag behind the
changelogs' ends (learners are standbys: the placer hands a task over once
its learner caught up) are computed here for the restoration thread to
publish.

Restoration thread only (its loop owns the restore consumer this uses).
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from runtime.logging import get_logger
from runtime.state.changelog_reading import TopicPartitionKey, restart_from_start
from runtime.state.standby import StandbyTask

log = get_logger("runtime.restoration")

_CHECKPOINT_INTERVAL_S = 5.0


class StandbyUpdates:
    """The standbys kept current on one restore consumer. See the module docstring."""

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer
        self._standbys: dict[str, StandbyTask] = {}
        self._standby_of: dict[TopicPartitionKey, str] = {}  # changelog partition -> id
        self._stores: dict[TopicPartitionKey, Any] = {}  # changelog partition -> store
        self._last_checkpoint = time.monotonic()

    def __bool__(self) -> bool:
        return bool(self._standbys)

    def ids(self) -> list[str]:
        return list(self._standbys)

    def start(self, standby: StandbyTask) -> None:
        """Assign the standby's changelogs from where its stores are."""
        partitions = []
        for store in standby.stores.values():
            if store.changelog_topic is None:
                continue
            tp = (store.changelog_topic, standby.partition)
            self._standby_of[tp] = standby.id
            self._stores[tp] = store
            start = standby.restore_from.get(tp)
            partitions.append(
                TopicPartition(tp[0], tp[1], start if start is not None else OFFSET_BEGINNING)
            )
        self._standbys[standby.id] = standby
        if partitions:
            self._consumer.incremental_assign(partitions)
        log.info("standby_started", task_id=standby.id)

    def drop(self, task_id: str) -> bool:
        """Unassign, checkpoint and close a standby; False if not kept here."""
        standby = self._standbys.pop(task_id, None)
        if standby is None:
            return False
        partitions = [tp for tp, owner in self._standby_of.items() if owner == task_id]
        for tp in partitions:
            del self._standby_of[tp]
            del self._stores[tp]
        if partitions:
            self._consumer.incremental_unassign([TopicPartition(t, p) for t, p in partitions])
        try:
            standby.close()
        except Exception as exc:
            log.warning("standby_close_failed", task_id=task_id, error=str(exc))
        log.info("standby_stopped", task_id=task_id, applied=standby.applied)
        return True

    def apply(
        self, tp: TopicPartitionKey, records: list[tuple[bytes, bytes | None]], next_offset: int
    ) -> None:
        """Changelog records of a partition; ignored if no standby reads it."""
        standby_id = self._standby_of.get(tp)
        if standby_id is not None:
            self._stores[tp].restore_batch(records, next_offset)
            self._standbys[standby_id].applied += len(records)

    def reached_end(self, tp: TopicPartitionKey, end_offset: int) -> None:
        """Caught up; an empty changelog still has a position."""
        store = self._stores.get(tp)
        if store is not None:
            store.update_changelog_offset(end_offset)

    def out_of_range(self, tp: TopicPartitionKey, position: int) -> bool:
        """Wipe and restart the standby store reading `tp` from the changelog's
        start; False if no standby reads it (any more)."""
        standby_id = self._standby_of.get(tp)
        if standby_id is None:
            return False
        restart_from_start(
            self._consumer, tp, position, self._stores[tp], self._standbys[standby_id], True
        )
        return True

    def maybe_checkpoint(self) -> None:
        """Every few seconds: each standby's checkpoint written."""
        if not self._standbys or time.monotonic() - self._last_checkpoint < _CHECKPOINT_INTERVAL_S:
            return
        self._last_checkpoint = time.monotonic()
        for standby in self._standbys.values():
            try:
                standby.checkpoint()
            except Exception as exc:
                log.warning("standby_checkpoint_failed", task_id=standby.id, error=str(exc))

    def positions(self) -> dict[str, dict[str, int]]:
        """Standby id -> {"<changelog>-<partition>": position}."""
        return {
            task_id: {
                f"{t}-{p}": store.changelog.changelog_offset
                for (t, p), store in self._stores.items()
                if self._standby_of[(t, p)] == task_id
                and store.changelog is not None
                and store.changelog.changelog_offset is not None
            }
            for task_id in self._standbys
        }

    def lags(self) -> dict[str, int]:
        """Per standby: records behind its changelogs' ends, from the
        watermarks the fetches brought (no request); absent while unknown."""
        lags: dict[str, int] = {}
        unknown: set[str] = set()
        for tp, store in self._stores.items():
            task_id = self._standby_of[tp]
            changelog = store.changelog
            position = changelog.changelog_offset if changelog is not None else None
            try:
                _low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(tp[0], tp[1]), cached=True
                )
            except KafkaException:
                high = -1
            if position is None or high < 0:
                unknown.add(task_id)
                continue
            lags[task_id] = lags.get(task_id, 0) + max(0, high - position)
        return {t: lag for t, lag in lags.items() if t not in unknown}
