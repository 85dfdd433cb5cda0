"""`StreamsConfig`, the typed settings object, and how it is built from a dict.

The fields of `StreamsConfig` *are* the table of known keys: each one is declared
with `setting(...)`, which carries the dotted key name, its type, default,
validation and a one-line doc (rendered by `runtime.config.table`). Adding a
key is adding one field. Defaults may be functions of the keys declared above
them. `build_config` validates a dict into it: known keys parsed, unknown ones
routed to a client's overrides or refused with what was likely meant, the
client checks of `client_properties` and `guarantees` applied.

The object is immutable, so any thread may read it; building it runs on the
caller's thread (`App(...)`, the CLI).
"""

from __future__ import annotations

import difflib
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, get_args

from runtime.config.client_properties import (
    RUNTIME_OWNED,
    check_one_cluster,
    is_secret,
    is_security_property,
    passthrough_value_problem,
)
from runtime.config.guarantees import check_client_guarantees
from runtime.config.keys import (
    KEY_FIELD,
    PREFIX_FIELD,
    REQUIRED,
    ConfigError,
    ConfigKey,
    passthrough,
    setting,
)
from runtime.config.query_settings import query_setting
from runtime.config_values import (
    JAVA_INT_MAX,
    JAVA_LONG_MAX,
    MAX_WAIT_MS,
    THREADS_CEILING,
    check_bootstrap_servers,
    check_host,
    check_http_url,
    check_name,
    check_no_controls,
    check_path,
    check_remote_url,
    check_socket_path,
    close_match,
    is_control,
    show_value,
)
from runtime.config_values import Invalid as _Invalid
from runtime.state.rocksdb_memory import (
    DEFAULT_MEMORY_BYTES,
    DEFAULT_WRITE_BUFFER_RATIO,
    MIN_MEMORY_BYTES,
    check_config_setter,
    config_setter_from_name,
)
from runtime.topology.serdes import BUILTIN, Serde

ProcessingGuarantee = Literal["at_least_once", "exactly_once_v2"]
ErrorHandler = Literal["log_and_fail", "log_and_continue", "dead_letter_queue"]
LogLevel = Literal["debug", "info", "warning", "error"]
TaskAssignment = Literal["group", "runtime"]

_GUARANTEES: tuple[str, ...] = get_args(ProcessingGuarantee)
_HANDLERS: tuple[str, ...] = get_args(ErrorHandler)
_LOG_LEVELS: tuple[str, ...] = get_args(LogLevel)
_TASK_ASSIGNMENTS: tuple[str, ...] = get_args(TaskAssignment)
StoreLayout = Literal["per-task", "consolidated"]
_STORE_LAYOUTS: tuple[str, ...] = get_args(StoreLayout)


# Computed defaults: each sees the parsed values of the keys declared above it.


def _client_id_default(values: Mapping[str, Any]) -> str:
    return str(values["application.id"])


def _cpu_count(values: Mapping[str, Any]) -> int:
    return min(os.cpu_count() or 1, int(values["processing.threads.limit"]))


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, as a container's
    cpuset limits it): what `processes=auto` means."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _autoscale_max_default(values: Mapping[str, Any]) -> int:
    return min(8, int(values["processing.threads.limit"]))


def _commit_interval_default(values: Mapping[str, Any]) -> int:
    return 100 if values["processing.guarantee"] == "exactly_once_v2" else 30000


def _state_dir_default(values: Mapping[str, Any]) -> str:
    return os.path.join(tempfile.gettempdir(), "streams-runtime")


def _dlq_topic_default(values: Mapping[str, Any]) -> str | None:
    handlers = (
        values["deserialization.exception.handler"],
        values["processing.exception.handler"],
        values["production.exception.handler"],
    )
    if "dead_letter_queue" in handlers:
        return f"{values['application.id']}-dlq"
    return None


_DLQ_DEFAULT_DOC = "`<application.id>-dlq` if a handler is `dead_letter_queue`, else unset"
_WAIT_DOC = (
    f"Values above {MAX_WAIT_MS} (about 24.8 days), Kafka's infinite "
    f"{JAVA_LONG_MAX} included, mean {MAX_WAIT_MS}."
)
_SAME_CLUSTER_DOC = (
    "A prefixed `bootstrap.servers` must name the brokers of `bootstrap.servers`, and "
    "security settings must be the same for all four clients (give them unprefixed)."
)
SHARED_SECURITY_DOC = (
    "librdkafka security properties for all four clients at once (consumer, producer, restore "
    "consumer, admin client), e.g. `security.protocol=SASL_SSL`, `sasl.mechanism`, "
    "`sasl.username`, `ssl.ca.location`. A prefixed one (`producer.sasl.username`) must agree "
    "with it and with the other clients: settings that differ between clients are refused "
    "before start-up, since a client that cannot authenticate hangs or fails only later."
)
_ID = r"[A-Za-z0-9._-]+"
_TOPIC = r"[A-Za-z0-9._-]{1,249}"


@dataclass(frozen=True)
class StreamsConfig:
    """The validated configuration of one runtime process. Read by any thread.

    Build it with `StreamsConfig.from_dict` or `load_config`. The field order is
    the order defaults are computed in: a computed default sees the keys above it.
    """

    # fmt: off
    # One line per key: attribute, key name, type, default, doc, validation.
    application_id: str = setting("application.id", "str", REQUIRED, "Names the consumer group, internal topics and state directory; at most 200 characters, so internal topic names stay within Kafka's 249.", pattern=_ID, max_length=200, check=check_name)
    bootstrap_servers: str = setting("bootstrap.servers", "str", REQUIRED, "Comma-separated `host:port` list of Kafka brokers (port 1-65535; IPv6 as `[address]:port`; an optional `SSL://`-style prefix).", check=check_bootstrap_servers)
    client_id: str = setting("client.id", "str", _client_id_default, "Prefix of the client ids of this process's Kafka clients.", default_doc="`application.id`", max_length=200, check=check_no_controls)
    processing_threads_limit: int = setting("processing.threads.limit", "int", 64, "Most processing threads this process may run: caps `processing.threads`, `processing.threads.max`, `admin threads set`/`add` and SIGTTIN.", min=1, max=THREADS_CEILING)
    processing_threads: int = setting("processing.threads", "int", _cpu_count, "Processing threads at start-up (resizable at runtime); at most `processing.threads.limit`.", min=0, max=THREADS_CEILING, default_doc="number of CPUs, at most `processing.threads.limit`")
    processes: int = setting("processes", "int", 1, "Processing processes of one daemon (`streams-runtime run`): each is a full runtime (its own consumer, producer and `processing.threads` threads) in the application's one consumer group, under one supervisor that owns the admin socket, `/metrics`, signals and the log (see the docs, Several processes). `auto`: the CPUs this process may run on. 1 (the default) runs no supervisor: today's one process. Embedded `App`s ignore it.", min=1, max=256, auto=("auto", usable_cpus))
    processes_resizable: bool = setting("processes.resizable", "bool", False, "Run the supervisor even at `processes=1`, so that `streams-runtime admin processes add|remove|set` can change the count at runtime (with `processes` above 1 it always can).")
    process_restart_backoff_ms: int = setting("process.restart.backoff.ms", "int", 1000, "Wait (ms) before restarting a processing process that died (kill -9, OOM, its app failed) when it had run for less than a minute; doubled for each further early death; the first death is restarted at once.", min=0, max=3_600_000)
    process_restart_backoff_max_ms: int = setting("process.restart.backoff.max.ms", "int", 60000, "Longest wait (ms) before restarting a processing process.", min=0, max=3_600_000)
    process_daemon: str | None = setting("process.daemon", "str", None, "Set by the daemon's supervisor for its processing processes: the daemon's identity, published with each process's status so that standby placement keeps a task's standby off the active's daemon (one machine); unset outside one. Not for users.", nullable=True, max_length=200, check=check_no_controls)
    process_slot: int = setting("process.slot", "int", -1, "Set by the daemon's supervisor for its processing processes (slot i: client.id `-p<i>`, its own transactional id); -1 outside one. Not for users.", min=-1, max=255)
    processing_guarantee: ProcessingGuarantee = setting("processing.guarantee", "enum", "at_least_once", "Commit offsets after output is acknowledged, or one transaction per commit.", choices=_GUARANTEES)
    allow_unsafe_producer_settings: bool = setting("allow.unsafe.producer.settings", "bool", False, "Under `at_least_once`, accept `producer.acks` 0 or 1 and `producer.enable.idempotence=false`, which are refused otherwise: with `acks=0` the producer never hears whether output arrived and with `acks=1` output a partition leader acknowledged is lost if the leader fails before replicating it (either way input offsets are committed past output that is gone), and without idempotence a retried batch can be duplicated or land behind a later one. Under `exactly_once_v2` these settings are always refused.")
    commit_interval_ms: int = setting("commit.interval.ms", "int", _commit_interval_default, f"How often (ms) to commit offsets or the transaction. {_WAIT_DOC}", min=0, max=JAVA_LONG_MAX, clamp=MAX_WAIT_MS, default_doc="`30000`; `100` with `exactly_once_v2`")
    buffered_records_per_partition: int = setting("buffered.records.per.partition", "int", 5000, "Input records buffered per partition before the partition is paused (it resumes at half; while named queries of different `query.<name>.priority` run, once 500 records fit, so a CPU-bound query's backlog refills in small bursts that a higher-priority record does not wait behind). The pause follows the `consume()` batch that reached the bound, so one partition can hold up to this - 1 + `max.poll.records` records (at the defaults 5,000 and 1,000: 5,999), and memory is bounded by that per assigned partition. librdkafka's prefetch is sized to it (a quarter of it per partition and 256 KiB fetches; with named queries half of it and 64 KiB fetches), since a pause drops what was prefetched.", min=1, max=JAVA_INT_MAX)
    task_timeslice_ms: int = setting("task.timeslice.ms", "int", 100, f"How long (ms) a processing thread keeps one task before giving others a turn. {_WAIT_DOC}", min=1, max=JAVA_LONG_MAX, clamp=MAX_WAIT_MS)
    gil_switch_interval_us: int = setting("gil.switch.interval.us", "int", 0, "If above 0, `App.start` sets CPython's `sys.setswitchinterval` to this many microseconds, for the whole process (the process's own comes back when the app stops). A thread waiting for the GIL held by a CPU-bound one (the polling thread beside a CPU-heavy query) waits up to this long for each turn, at the cost of more hand-overs between CPU-bound threads; measured effect: see the docs, Several queries. 0: automatic: 100 while named queries of different `query.<name>.priority` run (at start, `add_query`, `remove_query`), else Python's own (5000).", min=0, max=1_000_000)
    sched_idle_lower_priorities: bool = setting("sched.idle.lower.priorities", "bool", False, "While named queries of different `query.<name>.priority` run, a processing thread runs a lower-priority query's task in Linux's SCHED_IDLE class (back to normal for a higher one): the polling thread, client threads and a co-located broker preempt it at once. Measured beside a CPU-bound query (queries benchmark, 2 cores): the higher query's p99 latency 9.8 ms against 11.0 ms without (medians of 15 and 10 runs, the broker on the other core; 6.0 ms alone), 8.1 ms with a processing thread the lower query may not take (`query.<name>.max.threads`); with the broker sharing both cores 11.7 against 16.5 ms, the CPU-bound query's throughput 3-7% lower. Off by default for its risk: on a host whose cores other processes saturate, such a thread holding the GIL waits long for a core, and the whole process with it (inside a container's own cgroup it competes with the container's threads only). Needs a thread to be allowed back to the normal class (root, CAP_SYS_NICE or `ulimit -e 20`); otherwise it stays off and the app logs `sched_idle_lower_priorities_off`.")
    num_threads_per_task: int = setting("num.threads.per.task", "int", 1, "Most processing threads that may work on one task (one partition) at once, on different keys: records of one key (its serialized bytes; records without a key form one key) are processed one at a time in offset order, other keys in parallel (key-parallel mode; see the docs). 1: one thread per task, the default code path.", min=1, max=THREADS_CEILING)
    processing_retry_attempts: int = setting("processing.retry.attempts", "int", 0, "Times a record whose processing raised is tried again before `processing.exception.handler` decides; other keys of the partition flow on meanwhile, the record's key waits. Above 0 it puts tasks in key-parallel mode even with `num.threads.per.task` = 1.", min=0, max=JAVA_INT_MAX)
    processing_retry_backoff_ms: int = setting("processing.retry.backoff.ms", "int", 100, f"Wait (ms) before the first retry of a failed record; doubled for each further one. {_WAIT_DOC}", min=0, max=JAVA_LONG_MAX, clamp=MAX_WAIT_MS)
    processing_retry_backoff_max_ms: int = setting("processing.retry.backoff.max.ms", "int", 10000, f"Longest wait (ms) between two retries of a record. {_WAIT_DOC}", min=0, max=JAVA_LONG_MAX, clamp=MAX_WAIT_MS)
    max_poll_records: int = setting("max.poll.records", "int", 1000, "Records per `consume()` batch of the polling thread; at most 1000000 (confluent-kafka's limit for one batch). Unset, it is 200 while named queries of different `query.<name>.priority` run (a higher-priority record waits for one batch of the others' records to be routed ahead of it).", min=1, max=1_000_000)
    poll_ms: int = setting("poll.ms", "int", 100, f"How long (ms) the polling thread blocks waiting for input. {_WAIT_DOC}", min=0, max=JAVA_LONG_MAX, clamp=MAX_WAIT_MS)
    max_task_idle_ms: int = setting("max.task.idle.ms", "int", 0, "A task with several input partitions (a join, a merge) takes the record with the oldest timestamp among them; while one of them has nothing buffered it waits: always while the consumer knows of records there not yet fetched, and then up to this long (ms) for new ones, before it processes the others' records anyway (counted: `streams_enforced_processing`). Kafka Streams' meaning (KIP-353, KIP-695): 0 waits only for records known to be there, -1 never waits (records are taken from what is buffered). Key-parallel tasks never wait.", min=-1, max=JAVA_LONG_MAX)
    state_dir: str = setting("state.dir", "str", _state_dir_default, "Directory for the state stores of all tasks (and the transactional id under `exactly_once_v2`); created if missing and checked for writing at start-up.", default_doc="`<tempdir>/streams-runtime`", check=check_path)
    default_key_serde: Serde = setting("default.key.serde", "serde", "bytes", "Serde for keys where the topology names none. `module:attr` names a serde object or a serde class (made with no arguments); nothing else is called.")
    default_value_serde: Serde = setting("default.value.serde", "serde", "bytes", "Serde for values where the topology names none. `module:attr` names a serde object or a serde class (made with no arguments); nothing else is called.")
    deserialization_exception_handler: ErrorHandler = setting("deserialization.exception.handler", "enum", "log_and_fail", "What to do with a record that fails to deserialize.", choices=_HANDLERS)
    processing_exception_handler: ErrorHandler = setting("processing.exception.handler", "enum", "log_and_fail", "What to do with a record that fails in processing.", choices=_HANDLERS)
    production_exception_handler: ErrorHandler = setting("production.exception.handler", "enum", "log_and_fail", "What to do with an output record the broker refuses for good (too large, invalid); other produce failures always stop the app.", choices=_HANDLERS)
    dead_letter_queue_topic: str | None = setting("errors.dead.letter.queue.topic.name", "str", _dlq_topic_default, "Dead-letter topic: failed records are also written here, with error headers.", pattern=_TOPIC, nullable=True, default_doc=_DLQ_DEFAULT_DOC, check=check_name)
    replication_factor: int = setting("replication.factor", "int", -1, "Replication factor of topics the runtime creates; -1: the broker's default.", min=1, max=32767, also=(-1,))
    topics_create_missing: bool = setting("topics.create.missing", "bool", False, "Create the topology's missing source and sink topics at start-up, with `topics.create.partitions` partitions (a topic co-partitioned with an existing one gets its count) and `replication.factor`, as `streams-runtime topics create` does. Off: a missing topic stops start-up (exit 2). Internal topics are always created.")
    topics_create_partitions: int = setting("topics.create.partitions", "int", 1, "Partitions of the source and sink topics `topics.create.missing` and `streams-runtime topics create` make (the command's `--partitions` wins); the number of tasks, so of processing threads that can work at once, per subtopology.", min=1, max=JAVA_INT_MAX)
    static_partitioner: Any = setting("static.partitioner", "partitioner", None, "Static partitioner of every sink and repartition topic: an object (or a class made with no arguments) with `static_partition(topic, key, num_partitions) -> int`, which must keep each key on its partition for good, and optionally `on_partition_expansion(old_count, new_count)` (run on one instance per expansion, again after a crash before it finished: make it idempotent) and `open(application_id, client_config, replication_factor)`/`close()` (called at the app's start and end). Keys then never move, and the app follows partition increases of its input topics live. Ready-made: an instance of `runtime.VirtualPartitioner` or `runtime.FirstSeenPartitioner` (which to pick: the docs' Partition expansion page). A partitioner given to one `to()`/`repartition()` is then ignored, with a warning at start-up. Unset: Kafka's default partitioner, and a partition increase of an input topic stops the app.", nullable=True)
    partition_check_interval_ms: int = setting("partition.check.interval.ms", "int", 5000, f"How often (ms) the polling thread reads the partition counts of the app's topics (one DescribeTopics request, without blocking the loop); the main consumer's metadata refresh follows the same interval unless `consumer.topic.metadata.refresh.interval.ms` is set. Bounds how late a partition increase is noticed. {_WAIT_DOC}", min=100, max=JAVA_LONG_MAX, clamp=MAX_WAIT_MS)
    log_level: LogLevel = setting("log.level", "enum", "info", "Log level of the runtime.", choices=_LOG_LEVELS)
    cache_max_bytes: int = setting("cache.max.bytes", "int", 10485760, "Bytes of store cache shared by ALL tasks and threads of the process (adding threads does not add cache); 0 turns caching off.", min=0, max=JAVA_LONG_MAX)
    num_standby_replicas: int = setting("num.standby.replicas", "int", 0, "Warm copies of each stateful task kept on other instances, for fast fail-over.", min=0, max=JAVA_INT_MAX)
    task_assignment: TaskAssignment = setting("task.assignment", "enum", "group", "Who places tasks on instances. `group`: the consumer group's assignor (librdkafka's cooperative-sticky, range for co-partitioned inputs, the broker's under `consumer.group.protocol=consumer`); a moved stateful task stops until its new owner restored it. `runtime`: the runtime places tasks itself (the classic group protocol only): a new owner first learns a stateful task (restores it as a standby) and takes it only once caught up; `streams-runtime admin prepare-leave` moves an instance's tasks away before it exits.", choices=_TASK_ASSIGNMENTS)
    acceptable_recovery_lag: int = setting("acceptable.recovery.lag", "int", 10000, "With `task.assignment=runtime`: changelog records a learner may still lag behind and be caught up enough to take its task over (Kafka Streams' meaning).", min=0, max=JAVA_LONG_MAX)
    max_warmup_replicas: int = setting("max.warmup.replicas", "int", 2, "With `task.assignment=runtime`: learners (warm-up replicas) restoring at once across the application, besides standbys (Kafka Streams' meaning).", min=1, max=JAVA_INT_MAX)
    state_cleanup_delay_ms: int = setting("state.cleanup.delay.ms", "int", 600000, "How long (ms) a task's state directory may stay unused here before it is deleted.", min=0, max=JAVA_LONG_MAX)
    state_store_layout: StoreLayout = setting("state.store.layout", "enum", "per-task", "How RocksDB stores sit on disk. `per-task`: one RocksDB database per store of each task under `<state.dir>/<application.id>/<task id>/`, positions in each task's `.checkpoint` file; a commit is one write per store; each task's checkpoint file is rewritten (after a sync) every 10,000 changelog records and before the task leaves. `consolidated`: ONE database per process (`<application.id>/consolidated/`) with a column family per store name (each task's keys under its task-id prefix) and the changelog positions in an `offsets` column family; a commit is ONE synced write batch for every task of the process, data and positions together (no `.checkpoint` files; old per-task directories are copied in once). Works with `state.remote.url`: a snapshot is a per-task export of the task's keys, portable between the layouts. A task moved to another process of the same daemon restores in full. See the docs, State stores.", choices=_STORE_LAYOUTS)
    state_rocksdb_memory_bytes: int = setting("state.rocksdb.memory.bytes", "int", DEFAULT_MEMORY_BYTES, "Bytes of RocksDB memory shared by ALL RocksDB stores of the process: one block cache of this size holds data, index and filter blocks, and the memtables are charged to it too (their share: `state.rocksdb.write.buffer.ratio`), so RocksDB's memory stays about this large whatever the number of tasks and stores. 256 MiB: a few hundred stores' index and filter blocks and a useful share of hot data blocks, and a daemon with 256 tasks still fits a 1 GiB container. What it does not bound, and a measurement: the docs, State stores.", min=MIN_MEMORY_BYTES, max=JAVA_LONG_MAX)
    state_rocksdb_write_buffer_ratio: float = setting("state.rocksdb.write.buffer.ratio", "float", DEFAULT_WRITE_BUFFER_RATIO, "Share of `state.rocksdb.memory.bytes` for memtables (write buffers) of all stores together: past 90% of it RocksDB flushes the largest memtable. Each store's memtable is a quarter of this share, between 1 and 16 MiB (not RocksDB's 64 MiB).", min=0.05, max=0.9)
    state_rocksdb_config_setter: Any = setting("state.rocksdb.config.setter", "callable", None, "Per-store RocksDB options (Kafka Streams' `rocksdb.config.setter`): `module:attr` naming a callable `setter(store_name, options)` (or a class made with no arguments whose instances are) that changes the `rocksdict.Options` each RocksDB store opens with, after the runtime's own settings. Resolved at start-up (a bad name stops it naming this key); an exception it raises stops the app naming the store. Replacing the block-based table factory or the write-buffer manager takes that store out of the shared budget.", nullable=True, resolve=config_setter_from_name, check_object=lambda value: check_config_setter(value, show_value(value)))
    state_rocksdb_statistics: bool = setting("state.rocksdb.statistics", "bool", False, "Turn on RocksDB's statistics in every store, for the read and write latency metrics (`streams_rocksdb_get_seconds`, `streams_rocksdb_write_seconds`). Off by default: RocksDB counts every operation into shared counters and histograms (measured here: 10-30% slower RocksDB gets and writes in a loop of RocksDB calls alone; a smaller, unmeasured share of a record's whole cost), and the metrics thread parses each store's statistics text (about 0.2 ms per store and interval).")
    state_rocksdb_metrics_interval_ms: int = setting("state.rocksdb.metrics.interval.ms", "int", 5000, "How often (ms) the RocksDB metrics thread reads each store's properties (keys, memtables, SST size, pending compaction, write stalls) for `/metrics` and `admin status`.", min=100, max=3_600_000)
    state_remote_url: str | None = setting("state.remote.url", "str", None, "Remote state: `s3://bucket/prefix` where snapshots of each task's RocksDB stores go (needs the `remote` extra, boto3). Credentials and region come from the usual AWS variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`, `AWS_PROFILE`, ...). Unset: off.", nullable=True, max_length=1024, check=check_remote_url)
    state_remote_endpoint: str | None = setting("state.remote.endpoint", "str", None, "Endpoint URL of an S3-compatible server (`http://host:port`; path-style addressing); unset: AWS S3.", nullable=True, max_length=1024, check=check_http_url)
    state_remote_checkpoint_interval_ms: int = setting("state.remote.checkpoint.interval.ms", "int", 300000, "How often (ms) each task's stores are snapshotted to `state.remote.url` (at the first commit after the interval; a task whose stores did not change is skipped).", min=1000, max=JAVA_LONG_MAX)
    state_remote_snapshots_retained: int = setting("state.remote.snapshots.retained", "int", 3, "Snapshots kept per task; older ones, and files no kept snapshot uses, are deleted after each upload.", min=1, max=1000)
    state_remote_snapshot_max_age_ms: int = setting("state.remote.snapshot.max.age.ms", "int", 43200000, "A snapshot older than this (ms) is not restored from. Keep it below the changelogs' `delete.retention.ms` (Kafka's default: 1 day): a compacted changelog may have dropped the tombstones of keys deleted after an older snapshot.", min=1000, max=JAVA_LONG_MAX)
    shutdown_timeout_ms: int = setting("shutdown.timeout.ms", "int", 30000, f"How long (ms) a graceful shutdown may take, final commit included. {_WAIT_DOC}", min=0, max=JAVA_LONG_MAX, clamp=MAX_WAIT_MS)
    admin_socket: str | None = setting("admin.socket", "str", None, "Path of the admin Unix socket (`streams-runtime admin`): at most 107 bytes as an absolute path, in a directory that exists and is writable (checked before start-up goes further). Unset: `streams-runtime run` opens one at a default path it logs at start (`admin_socket_listening`), where `streams-runtime admin` finds it by itself: `$XDG_RUNTIME_DIR/streams-runtime/<application.id>.sock`, else `<tempdir>/streams-runtime-<uid>/` or `/tmp/streams-runtime-<uid>/` (a private directory made if missing; a long application id is cut and hashed, a second daemon of the application on the host adds `+<pid>`). `\"\"` or `none`: no socket. An embedded `App` opens none.", nullable=True, check=check_socket_path, default_doc="a default path (see description)", off_words=("", "none"))
    admin_socket_max_connections: int = setting("admin.socket.max.connections", "int", 32, "Admin socket clients connected at once; one more is told it is busy and closed (each holds a file descriptor).", min=1, max=4096)
    admin_socket_max_buffered_bytes: int = setting("admin.socket.max.buffered.bytes", "int", 8388608, "Bytes of unfinished request lines the admin socket holds across all clients; a line that would exceed it gets an error reply and is dropped. One line is at most 1 MiB in any case.", min=1024, max=JAVA_INT_MAX)
    admin_socket_idle_timeout_ms: int = setting("admin.socket.idle.timeout.ms", "int", 300000, f"An admin client that sends no complete request line for this long (ms) is disconnected. {_WAIT_DOC}", min=1, max=JAVA_LONG_MAX, clamp=MAX_WAIT_MS)
    metrics_port: int | None = setting("metrics.port", "int", None, "Port of the HTTP endpoint for `/metrics`, `/healthz`, `/readyz`; 0: any free port; unset: off.", min=0, max=65535, nullable=True)
    metrics_host: str = setting("metrics.host", "str", "127.0.0.1", "Address the metrics endpoint listens on: an IP address or a host name.", max_length=253, check=check_host)
    metrics_max_connections: int = setting("metrics.max.connections", "int", 64, "Metrics endpoint connections open at once (each holds a file descriptor). At the cap a new connection evicts the oldest one still waiting for its request head, so idle or slow clients cannot lock a scrape out; when all are being answered, one more gets `503` and is closed. The daemon keeps it within a quarter of the process's open-files limit (with the admin socket's clients), lowering it with a warning if need be.", min=1, max=4096)
    metrics_idle_timeout_ms: int = setting("metrics.idle.timeout.ms", "int", 10000, f"A metrics client that has not sent its whole request head this long (ms) after connecting (a slow or stalled client), or leaves its response unread this long, is disconnected. {_WAIT_DOC}", min=1, max=JAVA_LONG_MAX, clamp=MAX_WAIT_MS)
    processing_threads_autoscale: bool = setting("processing.threads.autoscale", "bool", False, "Let the daemon add processing threads while lag grows and all are busy, and remove idle ones.")
    processing_threads_min: int = setting("processing.threads.min", "int", 1, "Fewest processing threads the autoscaler keeps.", min=0, max=THREADS_CEILING)
    processing_threads_max: int = setting("processing.threads.max", "int", _autoscale_max_default, "Most processing threads the autoscaler starts; at most `processing.threads.limit`.", min=1, max=THREADS_CEILING, default_doc="`8`, at most `processing.threads.limit`")
    # fmt: on

    consumer_overrides: dict[str, Any] = passthrough(
        "consumer.",
        "librdkafka properties of the main consumer; checked at start-up by building the "
        "client without contacting a broker (a refused one stops start-up naming the key). "
        "The runtime's `session.timeout.ms` is 10000 (librdkafka's 45000 made a new group's "
        "first join on the development broker take 23 s and fail-over 45 s). Refused: "
        "`group.id` (the group is `application.id`), `enable.auto.commit` or "
        "`enable.auto.offset.store` true (the runtime commits), and under `exactly_once_v2` an "
        "`isolation.level` other than `read_committed`. " + _SAME_CLUSTER_DOC,
    )
    producer_overrides: dict[str, Any] = passthrough(
        "producer.",
        "librdkafka properties of the producer; checked at start-up the same way. Refused: "
        "`transactional.id` (the runtime's), `acks` other than `all`/`-1` and "
        "`enable.idempotence=false` (allowed under `at_least_once` with "
        "`allow.unsafe.producer.settings`), and under `exactly_once_v2` "
        "`max.in.flight.requests.per.connection` above 5. " + _SAME_CLUSTER_DOC,
    )
    restore_consumer_overrides: dict[str, Any] = passthrough(
        "restore.consumer.",
        "librdkafka properties of the restore consumer; checked at start-up the same way. "
        "Refused: `group.id`, `enable.partition.eof=false` (restores would never end), "
        "`enable.auto.commit` or `enable.auto.offset.store` true, and under `exactly_once_v2` an "
        "`isolation.level` other than `read_committed`. " + _SAME_CLUSTER_DOC,
    )
    admin_overrides: dict[str, Any] = passthrough(
        "admin.",
        "librdkafka properties of the admin client (not the `admin.socket*` keys above); "
        "checked at start-up the same way. " + _SAME_CLUSTER_DOC,
    )

    query_settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    """`query.<name>.<setting>` keys (named queries): name -> setting -> value."""

    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The validated input, keys as given (for display and `with_overrides`)."""

    @property
    def exactly_once(self) -> bool:
        return self.processing_guarantee == "exactly_once_v2"

    @property
    def key_parallel(self) -> bool:
        """Tasks run key-parallel (runtime.processing.key_parallel)."""
        return self.num_threads_per_task > 1 or self.processing_retry_attempts > 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StreamsConfig:
        """Validate `d` (dotted keys; typed values or strings) into a config.

        A value of `None` means "not set". Raises `ConfigError`.
        """
        return build_config(d, {})

    def with_overrides(self, **changes: Any) -> StreamsConfig:
        """A new config with some attributes changed, validated and re-derived.

        Keyword names are attribute names (`processing_threads=2`); values are as
        `from_dict` takes them. An override dict replaces all keys under its prefix.
        Computed defaults (`commit.interval.ms`, the DLQ topic, ...) follow.
        """
        raw = dict(self.raw)
        for attr, value in changes.items():
            if attr in _KEY_BY_ATTR:
                raw[_KEY_BY_ATTR[attr]] = value
            elif attr in _PREFIX_BY_ATTR:
                raw = {k: v for k, v in raw.items() if _route(k) != attr}
                prefix = _PREFIX_BY_ATTR[attr]
                raw.update({prefix + k: v for k, v in dict(value).items()})
            else:
                names = [*_KEY_BY_ATTR, *_PREFIX_BY_ATTR]
                close = difflib.get_close_matches(attr, names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(attr, f"no such config attribute{hint}")
        return build_config(raw, {})

    def as_display_dict(self) -> dict[str, Any]:
        """Effective values under their dotted keys; serdes by name, secrets masked."""
        out: dict[str, Any] = {}
        for spec in KEYS.values():
            value = getattr(self, spec.attr)
            if spec.kind == "serde":
                value = _serde_name(value, self.raw.get(spec.name))
            elif spec.kind in ("partitioner", "callable") and value is not None:
                given = self.raw.get(spec.name)
                value = given if isinstance(given, str) else repr(value)
            out[spec.name] = value
        for query, settings in sorted(self.query_settings.items()):
            for setting_name, value in settings.items():
                out[f"query.{query}.{setting_name}"] = value
        for prefix, attr in PASSTHROUGH_ATTRS:
            for prop, value in getattr(self, attr).items():
                out[prefix + prop] = "********" if is_secret(prop) else value
        return out


KEYS: Mapping[str, ConfigKey] = {
    spec.name: replace(spec, attr=f.name)
    for f in fields(StreamsConfig)
    if (spec := f.metadata.get(KEY_FIELD)) is not None
}
_KEY_BY_ATTR = {spec.attr: name for name, spec in KEYS.items()}
PASSTHROUGH_ATTRS: tuple[tuple[str, str], ...] = tuple(
    (f.metadata[PREFIX_FIELD][0], f.name)
    for f in fields(StreamsConfig)
    if PREFIX_FIELD in f.metadata
)
PASSTHROUGH_DOCS = {
    f.name: f.metadata[PREFIX_FIELD][1] for f in fields(StreamsConfig) if PREFIX_FIELD in f.metadata
}
_PREFIX_BY_ATTR = {attr: prefix for prefix, attr in PASSTHROUGH_ATTRS}
# Longest first, so `restore.consumer.x` is not taken for `consumer.`.
_ROUTES = sorted(PASSTHROUGH_ATTRS, key=lambda pa: len(pa[0]), reverse=True)
PASSTHROUGH_PREFIXES: tuple[str, ...] = tuple(prefix for prefix, _ in PASSTHROUGH_ATTRS)


def _route(key: str) -> str | None:
    """The override-dict attribute an unknown key goes to, or None."""
    if key in KEYS:
        return None
    for prefix, attr in _ROUTES:
        if key.startswith(prefix):
            return attr
    return None


def _unknown_key_reason(key: str, value: Any = None) -> str:
    """Why `key` is refused, and what was likely meant: a streams-runtime key
    it is close to, or, for a librdkafka property given without a prefix
    (`auto.offset.reset`), the key with the prefix of the client it is for
    (`consumer.auto.offset.reset`): librdkafka itself says which client that
    is (`runtime.librdkafka_properties.librdkafka_role`, asked offline, only on this
    error path)."""
    prefixes = ", ".join(PASSTHROUGH_PREFIXES)
    needs_prefix = (
        f"client properties need a prefix: {prefixes} "
        "(security.protocol, sasl.* and ssl.* may be given unprefixed, for all clients)"
    )
    prop_hint = _client_property_hint(key, value)
    if prop_hint is not None:
        return f"unknown key; {prop_hint}; {needs_prefix}"
    close = close_match(key, list(KEYS))
    hint = f" (did you mean {close!r}?)" if close else ""
    return f"unknown key{hint}; {needs_prefix}"


def _client_property_hint(key: str, value: Any) -> str | None:
    """`a librdkafka consumer property: did you mean 'consumer.<key>'?` when
    `key` (or a common librdkafka property it is a misspelling of) is one;
    None when it names no librdkafka property."""
    from runtime.librdkafka_properties import close_property, librdkafka_role

    if len(key) > 200 or any(is_control(c) for c in key):
        return None
    # A secret is not kept in librdkafka_role's cache: common values are tried.
    if value is None or is_secret(key):
        text = ""
    else:
        text = "true" if value is True else "false" if value is False else str(value)
    role = librdkafka_role(key, text[:1000])
    prop = key
    if role is None:
        near = close_property(key)
        if near is None:
            return None
        prop, role = near, librdkafka_role(near)
        if role is None:
            return None
    if role == "any":
        return (
            f"{prop} is a librdkafka property of every client: give it to each client it is "
            f"for, e.g. {'consumer.' + prop!r} and {'producer.' + prop!r}"
        )
    return f"{prop} is a librdkafka {role} property: did you mean {role + '.' + prop!r}?"


_CAPPED_BY_THREADS_LIMIT = (
    "processing.threads",
    "processing.threads.min",
    "processing.threads.max",
)


def build_config(given: Mapping[str, Any], sources: Mapping[str, str]) -> StreamsConfig:
    """Validate `given` into a `StreamsConfig`; `sources` says where keys came from."""

    def source(key: str) -> str:
        return f" (from {sources[key]})" if key in sources else ""

    known: dict[str, Any] = {}
    overrides: dict[str, dict[str, Any]] = {attr: {} for _, attr in PASSTHROUGH_ATTRS}
    shared: dict[str, Any] = {}  # unprefixed security properties, for every client
    query_settings: dict[str, dict[str, Any]] = {}
    for key, value in given.items():
        if not isinstance(key, str):
            raise ConfigError(show_value(key), "config keys must be strings")
        if key in KEYS:
            known[key] = value
            continue
        if is_security_property(key):
            if value is not None:
                reason = passthrough_value_problem(key, value)
                if reason is not None:
                    raise ConfigError(key, reason + source(key))
                shared[key] = value
            continue
        if key.startswith("query."):
            if value is not None:
                try:
                    name, setting_name, parsed = query_setting(key, value)
                except ConfigError as exc:
                    raise ConfigError(key, exc.reason + source(key)) from None
                query_settings.setdefault(name, {})[setting_name] = parsed
            continue
        attr = _route(key)
        if attr is None:
            raise ConfigError(key, _unknown_key_reason(key, value) + source(key))
        prop = key[len(_PREFIX_BY_ATTR[attr]) :]
        if not prop:
            raise ConfigError(key, "a client property name must follow the prefix")
        if prop in RUNTIME_OWNED.get(attr, ()):
            raise ConfigError(key, RUNTIME_OWNED[attr][prop] + source(key))
        if value is not None:
            reason = passthrough_value_problem(prop, value)
            if reason is not None:
                raise ConfigError(key, reason + source(key))
        overrides[attr][prop] = value

    values: dict[str, Any] = {}
    for name, spec in KEYS.items():
        value = known.get(name)
        try:
            if value is None:
                if spec.required:
                    raise _Invalid("required, but not set")
                value = spec.default_for(values)
            values[name] = spec.parse(value)
        except _Invalid as exc:
            raise ConfigError(name, exc.reason + source(name)) from None

    for name in _CAPPED_BY_THREADS_LIMIT:
        limit = values["processing.threads.limit"]
        if values[name] > limit:
            reason = f"{values[name]} is above processing.threads.limit ({limit})"
            raise ConfigError(name, reason + source(name))

    check_client_guarantees(overrides, values, _PREFIX_BY_ATTR, source)
    check_one_cluster(shared, overrides, values["bootstrap.servers"], _PREFIX_BY_ATTR, source)

    protocol = str(overrides["consumer_overrides"].get("group.protocol", "classic")).lower()
    if values["task.assignment"] == "runtime" and protocol == "consumer":
        reason = (
            "'runtime' needs the classic group protocol (KIP-848's consumer.group.protocol="
            "consumer forbids choosing partitions); use task.assignment=group with it"
        )
        raise ConfigError("task.assignment", reason + source("task.assignment"))

    attrs: dict[str, Any] = {KEYS[name].attr: value for name, value in values.items()}
    attrs.update(overrides)
    return StreamsConfig(**attrs, query_settings=query_settings, raw=dict(given))


def _serde_name(serde: Serde, given: Any) -> str:
    if isinstance(given, str):
        builtin = given.strip().lower()
        return builtin if builtin in BUILTIN else given
    for name, builtin_serde in BUILTIN.items():
        if serde is builtin_serde:
            return name
    return f"{type(serde).__module__}:{type(serde).__qualname__}"
