"""The app's wiring: the start-up checks, then every part of one running app
built and connected, started, and taken down again in order.

`App.start` calls `assemble` (under the app's state lock, on the caller's
thread): it checks the cluster and topics, builds the restoration thread, the
polling thread (with the app's hooks), remote-state capture, the cleanup
thread and the RocksDB metrics thread (with the app's one `RocksDBMemory`:
the block cache and write-buffer budget every store shares), and returns them as one `Assembly`; any check that fails raises before
a thread starts. The processing thread pool, task manager and record collector
exist from `App.__init__` on and are passed in. `Assembly.take_down` is the
supervisor thread's half: once the polling thread has ended, the rest stops
in the reverse order.

`assemble` and `start`: the thread calling `App.start`. `take_down`: the
supervisor thread. `closing_on`: any thread (racy reads, for the log).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runtime.collector.collector import RecordCollector
from runtime.config import StreamsConfig
from runtime.isolation.offsets import carry_back_from_children
from runtime.isolation.queries import IsolatedQueries
from runtime.kafka.clients import admin_config, global_consumer_config, restore_consumer_config
from runtime.kafka.cluster import StartupAdmin
from runtime.kafka.serde_check import check_serdes_on_samples
from runtime.kafka.startup_checks import check_startup
from runtime.kafka.topics import TopicError, TopicLayout, create_user_topics, resolve_topics
from runtime.logging import get_logger
from runtime.partitioning.expansion_marker import finish_interrupted_callbacks
from runtime.partitioning.static import open_static_partitioner
from runtime.placement.records import status_topic_name
from runtime.placement.status_view import StatusTopicView
from runtime.polling.polling_thread import PollingThread, PollingThreadHooks
from runtime.processing.errors import ErrorPolicy
from runtime.processing.key_lanes import key_parallel_settings
from runtime.processing.task_manager import TaskManager
from runtime.processing.task_settings import TaskSettings
from runtime.processing.threads import ProcessingThreadPool
from runtime.state.cache_budget import CacheBudget
from runtime.state.cleanup import CleanupThread
from runtime.state.consolidated import ConsolidatedStores, consolidated_directory
from runtime.state.global_store import global_directory
from runtime.state.global_thread import GlobalStreamThread
from runtime.state.remote.capture import SnapshotCapture
from runtime.state.remote.manager import RemoteState
from runtime.state.remote.settings import RemoteSettings
from runtime.state.restoration import RestorationThread
from runtime.state.rocksdb_memory import RocksDBMemory, RocksDBMemorySettings
from runtime.state.rocksdb_metrics import RocksDBMetricsThread
from runtime.topology.topology import Topology

log = get_logger("runtime.app")


@dataclass
class Assembly:
    """The parts `App.start` built, and the order they start and stop in."""

    layout: TopicLayout
    restoration: RestorationThread
    polling: PollingThread
    # Remote state (state.remote.url) and a stateful topology only.
    capture: SnapshotCapture | None
    # A topology with state only.
    cleanup: CleanupThread | None
    # The RocksDB metrics thread (a topology with state only).
    rocksdb_metrics: RocksDBMetricsThread | None
    # The process's one database (state.store.layout=consolidated); closed
    # once every task is.
    consolidated: ConsolidatedStores | None
    # Undoes static.partitioner's open() (FirstSeenPartitioner's reader).
    close_partitioner: Callable[[], None]
    # Topics the runtime writes besides the topologies' (add_query resolves
    # them again with a new query's).
    extra_outputs: dict[str, int]
    extra_configs: dict[str, dict[str, str]]
    # What the supervisor thread does after the polling thread ended (for
    # `closing_on`); written by the supervisor, read racily.
    supervisor_step: str | None = None
    # The global thread (a topology with global tables only).
    global_thread: GlobalStreamThread | None = None

    def bootstrap_global_stores(self) -> None:
        """Load the global tables before anything processes (the caller of
        `App.start`; Kafka Streams' start blocks the same way). On failure
        undoes what `assemble` opened and raises GlobalStoreError."""
        if self.global_thread is None:
            return
        try:
            self.global_thread.start_and_bootstrap()
        except BaseException:
            self.close_partitioner()
            if self.consolidated is not None:
                self.consolidated.close()
            raise

    def start(self) -> None:
        """Start the restoration, cleanup, RocksDB metrics and polling threads
        (in that order: the polling thread hands tasks to the restoration thread)."""
        self.restoration.start()
        if self.cleanup is not None:
            self.cleanup.start()
        if self.rocksdb_metrics is not None:
            self.rocksdb_metrics.start()
        self.polling.start()

    def take_down(
        self, pool: ProcessingThreadPool, isolated: IsolatedQueries, timeout_s: float
    ) -> None:
        """Wait for the polling thread to end, then stop everything else
        (supervisor thread); each wait up to `timeout_s`."""
        self.polling.join()
        self.supervisor_step = "stopping the processing threads"
        pool.stop_all(timeout=timeout_s)
        if self.cleanup is not None:
            self.cleanup.request_stop()
        if self.rocksdb_metrics is not None:
            self.rocksdb_metrics.request_stop()
        self.supervisor_step = "stopping the restoration thread"
        self.restoration.request_stop()
        self.restoration.join(timeout=timeout_s)
        if self.global_thread is not None:
            self.supervisor_step = "stopping the global thread"
            self.global_thread.request_stop()
            self.global_thread.join(timeout=timeout_s)
            if not self.global_thread.is_alive():  # no processing thread reads them now
                self.global_thread.close_stores()
        if self.consolidated is not None and not self.restoration.is_alive():
            # Every task and standby is closed (polling and restoration
            # threads ended): no column family is in use any more.
            self.consolidated.close()
        self.supervisor_step = "stopping the query processes"
        isolated.stop_all(timeout=timeout_s)
        self.supervisor_step = "closing the static partitioner"
        self.close_partitioner()  # no thread partitions any more
        self.supervisor_step = None

    def closing_on(self, pool: ProcessingThreadPool) -> list[str]:
        """What a close still waits for (threads alive and their step), for
        the log. Any thread; racy reads."""
        waiting: list[str] = []
        polling = self.polling
        if polling.is_alive():
            step = polling.shutdown_step or "its loop (the stop request not seen yet)"
            waiting.append(f"polling thread: {step}")
        names = [t.name for t in pool.threads() if t.is_alive()]
        if names:
            waiting.append(f"processing threads: {', '.join(names)}")
        if self.restoration.is_alive():
            waiting.append("restoration thread")
        if self.global_thread is not None and self.global_thread.is_alive():
            waiting.append("global thread")
        if self.supervisor_step is not None:
            waiting.append(f"supervisor: {self.supervisor_step}")
        return waiting


def assemble(
    config: StreamsConfig,
    topology: Topology,
    *,
    named_queries: bool,
    query_priorities: list[int],
    task_manager: TaskManager,
    collector: RecordCollector,
    error_policy: ErrorPolicy,
    hooks: PollingThreadHooks,
    instance_id: str,
) -> Assembly:
    """Check the cluster and topics and build the parts of a running app
    (none started). `named_queries`: the app runs a mapping of queries.

    Raises ConfigError (`state.dir` not writable, a client property
    librdkafka refuses; see `runtime.kafka.startup_checks`), TopicError (the
    cluster cannot be reached, missing topics, co-partitioning, a static
    partitioner that cannot open) and SerializationError (a sink's serde
    refuses what the topology makes of the newest input record;
    `runtime.kafka.serde_check`).
    """
    has_state = bool(topology.store_specs())
    consolidated_layout = config.state_store_layout == "consolidated"
    check_startup(
        config,
        uses_state_dir=has_state
        or config.exactly_once
        or consolidated_layout
        or bool(topology.global_stores),
    )
    startup_admin = StartupAdmin(config)
    startup_admin.wait_for_cluster()
    admin = startup_admin.client
    extra = {config.dead_letter_queue_topic: 1} if config.dead_letter_queue_topic else {}
    extra_configs: dict[str, dict[str, str]] = {}
    # Every instance publishes its tasks on the status topic and reads
    # everyone's (standby placement, SHUTDOWN_APPLICATION requests).
    status_topic = status_topic_name(config.application_id)
    extra[status_topic] = 1
    extra_configs[status_topic] = {"cleanup.policy": "compact"}
    if config.topics_create_missing:
        create_user_topics(
            admin,
            topology,
            config.topics_create_partitions,
            config.replication_factor,
        )
    layout = resolve_topics(
        admin,
        topology,
        config.application_id,
        config.replication_factor,
        extra,
        extra_configs=extra_configs,
    )
    # A sink serde that cannot take what the topology makes fails
    # here, on the newest input, instead of on the first record later.
    check_serdes_on_samples(config, topology, layout)
    if named_queries:
        # A query that ran in a child process before resumes from
        # its commits there (runtime.isolation.offsets).
        carry_back_from_children(config, topology)
    rocksdb_memory = RocksDBMemory(
        RocksDBMemorySettings(
            memory_bytes=config.state_rocksdb_memory_bytes,
            write_buffer_ratio=config.state_rocksdb_write_buffer_ratio,
            config_setter=config.state_rocksdb_config_setter,
            statistics=config.state_rocksdb_statistics,
        )
    )
    settings = TaskSettings(
        application_id=config.application_id,
        default_key_serde=config.default_key_serde,
        default_value_serde=config.default_value_serde,
        error_policy=error_policy,
        partition_counts=layout.partitions,
        state_dir=config.state_dir,
        cache_budget=CacheBudget(config.cache_max_bytes),
        static_partitioner=config.static_partitioner,
        key_parallel=key_parallel_settings(config),
        rocksdb_memory=rocksdb_memory,
        max_task_idle_ms=config.max_task_idle_ms,
    )
    if config.static_partitioner is not None:
        for sink, topic in topology.partitioned_sinks():
            log.warning(
                "sink_partitioner_ignored",
                sink=sink,
                topic=topic,
                reason="static.partitioner is set: it partitions every sink",
            )
    # An expansion callback whose runner stopped before recording it
    # done runs again here (runtime.partitioning.expansion_marker).
    finish_interrupted_callbacks(
        admin,
        config.application_id,
        config.static_partitioner,
        config.replication_factor,
    )
    # A partitioner with a map in Kafka (FirstSeenPartitioner) reads
    # it whole before any record is partitioned.
    try:
        close_partitioner = open_static_partitioner(
            config.static_partitioner,
            config.application_id,
            admin_config(config),
            config.replication_factor,
        )
    except Exception as exc:  # the partitioner's own code or its topic
        raise TopicError(
            f"static.partitioner {config.static_partitioner!r} could not open: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    # The state manager's thread; it also reads the status topic, so
    # even a stateless app has one (its consumer is the third client).
    # Remote state (state.remote.url): snapshots are taken at commits
    # and uploaded/downloaded by the restoration thread.
    remote_settings = RemoteSettings.from_config(config)
    remote = (
        RemoteState(remote_settings, config.state_dir, instance_id)
        if remote_settings is not None and has_state
        else None
    )
    status_view = StatusTopicView()
    restoration = RestorationThread(
        f"{config.client_id}-RestorationThread",
        restore_consumer_config(config),
        status_topic,
        remote=remote,
        status_view=status_view,
    )
    # state.store.layout=consolidated: the process's one database, opened
    # last (a failure before leaves nothing open), before any task exists;
    # also without state now: a named query added later may bring some.
    consolidated = None
    if consolidated_layout:
        consolidated = ConsolidatedStores(
            consolidated_directory(config.state_dir, config.application_id, config.process_slot),
            rocksdb_memory,
        )
        settings.consolidated = consolidated
    polling = PollingThread(
        config,
        topology,
        layout,
        settings,
        task_manager,
        collector,
        hooks,
        restoration,
        instance_id,
        query_priorities=query_priorities,
        status_view=status_view,
        named_queries=named_queries,
    )
    capture = None
    if remote is not None:
        capture = remote.capture(restoration.add_upload)
        polling.committer.after_commit = capture.after_commit
    if consolidated is not None:
        polling.committer.write_state = consolidated.write_commit
    cleanup = None
    rocksdb_metrics = None
    if has_state:
        cleanup = CleanupThread(
            f"{config.client_id}-CleanupThread",
            Path(config.state_dir) / config.application_id,
            config.state_cleanup_delay_ms,
            owned=lambda: polling.owned,
            consolidated=consolidated,
        )
        assert settings.rocksdb_memory is not None
        rocksdb_metrics = RocksDBMetricsThread(
            f"{config.client_id}-RocksDBMetricsThread",
            settings.rocksdb_memory,
            config.state_rocksdb_metrics_interval_ms / 1000.0,
        )
    global_thread = None
    if topology.global_stores:
        global_thread = GlobalStreamThread(
            f"{config.client_id}-GlobalStreamThread",
            global_consumer_config(config),
            [(g.store, g.topic) for g in topology.global_stores],
            global_directory(config.state_dir, config.application_id, config.process_slot),
            rocksdb_memory,
            config.commit_interval_ms / 1000.0,
        )
        settings.global_stores = global_thread.stores  # filled when it opens them
        polling.global_thread = global_thread
    return Assembly(
        global_thread=global_thread,
        layout=layout,
        restoration=restoration,
        polling=polling,
        capture=capture,
        cleanup=cleanup,
        rocksdb_metrics=rocksdb_metrics,
        consolidated=consolidated,
        close_partitioner=close_partitioner,
        extra_outputs=extra,
        extra_configs=extra_configs,
    )
