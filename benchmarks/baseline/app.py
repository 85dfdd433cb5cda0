"""``BaselineApp``: N classic stream threads in one process (see the package docstring).

Configured with the same dict (or ``StreamsConfig``) as ``runtime.App``;
``processing.threads`` is the number of stream threads. Start-up does what
``App.start`` does before its threads run: topic checks and internal topic
creation with ``resolve_topics``, one ``TaskSettings`` per thread (the cache
budget split evenly over the threads, as Kafka Streams splits its cache).

Gates (for benchmarks): ``hold_processing()`` / ``hold_restoration()`` before
``start()`` keep the threads from processing / restoring (they still poll and
buffer up to the bound, and take part in rebalances) until ``release()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka.admin import AdminClient

from benchmarks.baseline.stream_thread import RESTORE_MODES, StreamThread, ThreadGates
from runtime.config import StreamsConfig
from runtime.kafka.clients import admin_config
from runtime.kafka.topics import TopicLayout, resolve_topics
from runtime.processing.errors import ErrorPolicy
from runtime.processing.task_settings import TaskSettings
from runtime.state.cache_budget import CacheBudget
from runtime.topology.topology import Topology


class BaselineApp:
    """The thread-per-client model. Any thread may call its methods."""

    def __init__(
        self,
        topology: Topology,
        config: Mapping[str, Any] | StreamsConfig,
        restore_mode: str = "blocking",
    ) -> None:
        if restore_mode not in RESTORE_MODES:
            raise ValueError(f"restore_mode must be one of {RESTORE_MODES}")
        self.config = (
            config if isinstance(config, StreamsConfig) else StreamsConfig.from_dict(config)
        )
        if self.config.exactly_once:
            raise ValueError("the baseline implements at_least_once only")
        if self.config.processing_threads < 1:
            raise ValueError("the baseline needs processing.threads >= 1 (stream threads)")
        self.topology = topology
        self.restore_mode = restore_mode
        self.gates = ThreadGates()
        self.gates.process.set()
        self.gates.restore.set()
        self.threads: list[StreamThread] = []
        self.layout: TopicLayout | None = None
        self.started_at: float | None = None
        # Set before start(): called on a stream thread with a task id as soon
        # as that task is restored, before it is processed.
        self.on_task_restored: Callable[[str], None] | None = None

    # --- gates --------------------------------------------------------------------

    def hold_processing(self) -> None:
        self.gates.process.clear()

    def hold_restoration(self) -> None:
        self.gates.restore.clear()

    def release(self) -> None:
        self.gates.restore.set()
        self.gates.process.set()

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        config = self.config
        admin = AdminClient(admin_config(config))
        extra = {config.dead_letter_queue_topic: 1} if config.dead_letter_queue_topic else {}
        self.layout = resolve_topics(
            admin, self.topology, config.application_id, config.replication_factor, extra
        )
        del admin
        count = config.processing_threads
        for index in range(1, count + 1):
            settings = TaskSettings(
                application_id=config.application_id,
                default_key_serde=config.default_key_serde,
                default_value_serde=config.default_value_serde,
                error_policy=ErrorPolicy(
                    deserialization=config.deserialization_exception_handler,
                    processing=config.processing_exception_handler,
                    dead_letter_topic=config.dead_letter_queue_topic,
                ),
                partition_counts=self.layout.partitions,
                state_dir=config.state_dir,
                cache_budget=CacheBudget(config.cache_max_bytes // count),
            )
            self.threads.append(
                StreamThread(
                    index,
                    config,
                    self.topology,
                    self.layout,
                    settings,
                    self.gates,
                    self.restore_mode,
                    self.on_task_restored,
                )
            )
        self.started_at = time.time()
        for thread in self.threads:
            thread.start()

    def close(self, timeout: float | None = None) -> bool:
        """Stop every thread (final commit each); True if all stopped in time."""
        if timeout is None:
            timeout = self.config.shutdown_timeout_ms / 1000.0
        self.release()
        for thread in self.threads:
            thread.request_stop()
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)

    # --- observability ---------------------------------------------------------------

    @property
    def failure(self) -> BaseException | None:
        for thread in self.threads:
            if thread.fatal_error is not None:
                return thread.fatal_error
        return None

    def assignment(self) -> list[frozenset[tuple[str, int]]]:
        """Each thread's assigned input partitions (racy snapshot)."""
        return [t.assigned for t in self.threads]

    def task_states(self) -> dict[str, str]:
        states: dict[str, str] = {}
        for thread in self.threads:
            states.update(thread.task_states())
        return states

    def task_processed(self) -> dict[str, int]:
        processed: dict[str, int] = {}
        for thread in self.threads:
            processed.update(thread.task_processed())
        return processed

    def restore_times(self) -> dict[str, tuple[float, float]]:
        times: dict[str, tuple[float, float]] = {}
        for thread in self.threads:
            times.update(thread.restore_times)
        return times

    def unacknowledged(self) -> int:
        return sum(t.unacknowledged() for t in self.threads if t.is_alive())

    def status(self) -> dict[str, Any]:
        threads = self.threads
        return {
            "model": "baseline",
            "restore_mode": self.restore_mode,
            "threads": [
                {
                    "name": t.name,
                    "alive": t.is_alive(),
                    "assigned": sorted(f"{tp}-{p}" for tp, p in t.assigned),
                    "rebalances": t.rebalances,
                    "processed": t.processed_total,
                    "commits": t.commits_total,
                }
                for t in threads
            ],
            "consumed": sum(t.consumed_total for t in threads),
            "processed": sum(t.processed_total for t in threads),
            "produced": sum(t.produced_total for t in threads),
            "commits": sum(t.commits_total for t in threads),
            "commit_failures": sum(t.commit_failures_total for t in threads),
            "restored": sum(t.restored_total for t in threads),
            "failure": repr(self.failure) if self.failure else None,
        }
