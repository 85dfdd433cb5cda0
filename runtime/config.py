"""Typed configuration: the table of known keys, validation, TOML/env/--set loading.

`StreamsConfig` is built and validated once at start-up (`load_config` or
`StreamsConfig.from_dict`); everything else reads its typed attributes, never a
raw dict. It is immutable, so any thread may read it.

The fields of `StreamsConfig` *are* the table of known keys: each one is declared
with `setting(...)`, which carries the dotted key name, its type, default,
validation and a one-line doc (rendered by `config_table_markdown`). Adding a key
is adding one field. Defaults may be functions of the keys declared above them.
The checks of single values (hosts, ports, paths, wait limits) live in
`runtime.config_values`; what needs the machine (state.dir, librdkafka) is
checked at start-up by `runtime.kafka.startup_checks`.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import stat
import tempfile
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, get_args

from runtime.config_values import (
    JAVA_INT_MAX,
    JAVA_LONG_MAX,
    MAX_CONFIG_FILE_BYTES,
    MAX_CONFIG_NESTING,
    MAX_INT_DIGITS,
    MAX_SERDE_CHARS,
    MAX_STR_CHARS,
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
    clamp_wait_s,
    close_match,
    is_control,
    one_line,
    show_value,
)
from runtime.config_values import Invalid as _Invalid
from runtime.partitioning.static import (
    check_static_partitioner,
    static_partitioner_from_name,
)
from runtime.topology.serdes import BUILTIN, Serde, serde_from_name

__all__ = [
    "ENV_PREFIX",
    "JAVA_LONG_MAX",
    "KEYS",
    "MAX_WAIT_MS",
    "clamp_wait_s",
    "PASSTHROUGH_PREFIXES",
    "ConfigError",
    "ConfigKey",
    "StreamsConfig",
    "config_table_markdown",
    "update_readme",
    "load_config",
]

ENV_PREFIX = "STREAMS_RUNTIME_"


ProcessingGuarantee = Literal["at_least_once", "exactly_once_v2"]
ErrorHandler = Literal["log_and_fail", "log_and_continue", "dead_letter_queue"]
LogLevel = Literal["debug", "info", "warning", "error"]
TaskAssignment = Literal["group", "runtime"]

_GUARANTEES: tuple[str, ...] = get_args(ProcessingGuarantee)
_HANDLERS: tuple[str, ...] = get_args(ErrorHandler)
_LOG_LEVELS: tuple[str, ...] = get_args(LogLevel)
_TASK_ASSIGNMENTS: tuple[str, ...] = get_args(TaskAssignment)


class ConfigError(ValueError):
    """A configuration value, key or file is wrong.

    `key` is the dotted key (or the offending `--set` string; empty for an error
    about a whole file), `reason` says what is wrong, `file` names the TOML file
    for file-level errors. The CLI turns it into exit code 2. The message is
    one line whatever it quotes: control characters in the reason (a value,
    a `--set` string, a path, a librdkafka message echoing a value) are
    escaped, so a two-line value cannot print a two-line error (issue 31).
    """

    def __init__(self, key: str, reason: str, *, file: str | None = None) -> None:
        self.key = key
        self.reason = one_line(reason)
        self.file = file
        if file is not None and not key:
            message = f"config file {show_value(file, 200)}: {self.reason}"
        else:
            message = f"config key {show_value(key, 120)}: {self.reason}"
        super().__init__(message)

    def __reduce__(self) -> Any:
        return (_config_error, (self.key, self.reason, self.file))


def _config_error(key: str, reason: str, file: str | None) -> ConfigError:
    return ConfigError(key, reason, file=file)


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()

Kind = Literal["str", "int", "bool", "enum", "serde", "partitioner"]
Default = Any  # a plain value, REQUIRED, or Callable[[Mapping[str, Any]], Any]

# ASCII digits only: Python's int() also takes "５" and "1_000", which no other
# Kafka tool would read as a number.
_INT_TEXT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})


@dataclass(frozen=True)
class ConfigKey:
    """One known key: name, type, default, validation and a one-line doc."""

    name: str
    kind: Kind
    default: Default
    doc: str
    min: int | None = None
    max: int | None = None
    also: tuple[int, ...] = ()  # integers allowed outside [min, max], e.g. -1
    choices: tuple[str, ...] = ()
    pattern: str | None = None
    nullable: bool = False
    clamp: int | None = None  # ints above it are accepted and stored as it (durations)
    max_length: int = MAX_STR_CHARS  # strings
    check: Callable[[str], None] | None = None  # more string validation; raises _Invalid
    default_doc: str | None = None  # how the README shows a computed default
    # Strings (compared lower-cased, stripped) that turn the setting off: parsed
    # as "" (admin.socket's "" or "none": no socket, while unset means a default).
    off_words: tuple[str, ...] = ()
    attr: str = ""  # the StreamsConfig attribute; filled in from the field name

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def default_for(self, values: Mapping[str, Any]) -> Any:
        """The default, given the parsed values of the keys declared above this one."""
        if callable(self.default):
            return self.default(values)
        return self.default

    def expected(self) -> str:
        """What a valid value looks like, as in "expected an integer >= 0"."""
        if self.kind == "int":
            text = "an integer"
            if self.min is not None and self.max is not None:
                text += f" between {self.min} and {self.max}"
            elif self.min is not None:
                text += f" >= {self.min}"
            elif self.max is not None:
                text += f" <= {self.max}"
            if self.also:
                text += " or " + " or ".join(str(n) for n in self.also)
            return text
        if self.kind == "bool":
            return "true or false"
        if self.kind == "enum":
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.kind == "serde":
            return f"a serde: one of {sorted(BUILTIN)} or 'module:attr'"
        if self.kind == "partitioner":
            return (
                "'module:attr' naming an object with static_partition(topic, key, num_partitions)"
            )
        if self.pattern is not None:
            return f"a string matching {self.pattern}"
        return "a non-empty string"

    def parse(self, value: Any) -> Any:
        """Coerce and validate one value (typed, or a string as from env/--set).

        Raises `_Invalid`; the caller turns it into a `ConfigError` naming the key.
        """
        if value is None and self.nullable:
            return None
        if self.off_words and isinstance(value, str) and value.strip().lower() in self.off_words:
            return ""
        if self.kind == "int":
            return self._parse_int(value)
        if self.kind == "bool":
            return self._parse_bool(value)
        if self.kind == "enum":
            return self._parse_enum(value)
        if self.kind == "serde":
            return self._parse_serde(value)
        if self.kind == "partitioner":
            return self._parse_partitioner(value)
        return self._parse_str(value)

    def _bad(self, value: Any, hint: str = "") -> _Invalid:
        return _Invalid(f"expected {self.expected()}, got {show_value(value)}{hint}")

    def _parse_int(self, value: Any) -> int:
        if isinstance(value, bool):
            raise self._bad(value)
        if isinstance(value, int):
            number = value
        elif isinstance(value, str) and _INT_TEXT.fullmatch(value.strip()):
            text = value.strip()
            sign = "-" if text.startswith("-") else ""
            digits = text.lstrip("+-").lstrip("0") or "0"
            # Refuse absurd lengths before int() (Python stops at 4300 digits,
            # leading zeros included, with its own ValueError; every key's
            # range ends far below that).
            if len(digits) > MAX_INT_DIGITS:
                raise self._bad(value)
            number = int(sign + digits)
        else:
            raise self._bad(value)
        in_range = (self.min is None or number >= self.min) and (
            self.max is None or number <= self.max
        )
        if not in_range and number not in self.also:
            raise self._bad(value)
        if self.clamp is not None:
            number = min(number, self.clamp)
        return number

    def _parse_bool(self, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            text = value.strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
        raise self._bad(value)

    def _parse_enum(self, value: Any) -> str:
        if not isinstance(value, str):
            raise self._bad(value)
        text = value.strip().lower()
        if text in self.choices:
            return text
        close = close_match(text, self.choices)
        raise self._bad(value, f" (did you mean {close!r}?)" if close else "")

    def _parse_serde(self, value: Any) -> Serde:
        if isinstance(value, str):
            if len(value) > MAX_SERDE_CHARS:
                raise self._bad(value)
            try:
                return serde_from_name(value)
            except ValueError as exc:
                raise _Invalid(str(exc)) from None
            # A user module failing on import or construction; SystemExit too:
            # an import must not end the process with exit 0.
            except (Exception, SystemExit) as exc:
                raise _Invalid(
                    f"cannot resolve serde {show_value(value)}: {type(exc).__name__}: {exc}"
                ) from None
        if isinstance(value, type):
            raise _Invalid(f"expected a serde object or name, got the class {value.__name__}")
        if isinstance(value, Serde):
            return value
        raise self._bad(value)

    def _parse_partitioner(self, value: Any) -> Any:
        """`module:attr` (imported; a class is made with no arguments) or, from
        code, the object itself."""
        if isinstance(value, str):
            if len(value) > MAX_SERDE_CHARS:
                raise self._bad(value)
            try:
                return static_partitioner_from_name(value)
            except ValueError as exc:
                raise _Invalid(str(exc)) from None
            except (Exception, SystemExit) as exc:  # the user's module failed
                raise _Invalid(
                    f"cannot resolve {show_value(value)}: {type(exc).__name__}: {exc}"
                ) from None
        if isinstance(value, (int, float, bytes, list, dict, type)) or value is None:
            raise self._bad(value)
        try:
            return check_static_partitioner(value, show_value(value))
        except ValueError as exc:
            raise _Invalid(str(exc)) from None

    def _parse_str(self, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self._bad(value)
        if len(value) > self.max_length:
            raise _Invalid(f"longer than {self.max_length} characters ({len(value)})")
        if "\x00" in value:
            raise _Invalid(f"contains a NUL character: {show_value(value)}")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            raise self._bad(value)
        if self.check is not None:
            self.check(value)
        return value

    # README rendering

    def type_doc(self) -> str:
        if self.kind == "int":
            return self.expected().removeprefix("an ")
        if self.kind == "bool":
            return "boolean"
        if self.kind == "enum":
            return "one of " + ", ".join(f"`{c}`" for c in self.choices)
        if self.kind == "serde":
            return "serde: " + ", ".join(f"`{n}`" for n in BUILTIN) + " or `module:attr`"
        if self.kind == "partitioner":
            return "`module:attr` or unset"
        text = "string"
        if self.pattern is not None:
            text += f" matching `{self.pattern}`"
        if self.nullable:
            text += " or unset"
        return text

    def default_doc_text(self) -> str:
        if self.required:
            return "required"
        if self.default_doc is not None:
            return self.default_doc
        if self.default is None:
            return "unset"
        return f"`{self.default}`"


_SPEC = "runtime.config.key"
_PREFIX = "runtime.config.prefix"


def setting(name: str, kind: Kind, default: Default, doc: str, **validation: Any) -> Any:
    """Declare a `StreamsConfig` field as the known key `name` (see `ConfigKey`)."""
    return field(metadata={_SPEC: ConfigKey(name, kind, default, doc, **validation)})


def passthrough(prefix: str, doc: str) -> Any:
    """Declare a `StreamsConfig` field collecting the unknown keys under `prefix`."""
    return field(default_factory=dict, metadata={_PREFIX: (prefix, doc)})


# Computed defaults: each sees the parsed values of the keys declared above it.


def _client_id_default(values: Mapping[str, Any]) -> str:
    return str(values["application.id"])


def _cpu_count(values: Mapping[str, Any]) -> int:
    return min(os.cpu_count() or 1, int(values["processing.threads.limit"]))


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
_SHARED_SECURITY_DOC = (
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
    processing_guarantee: ProcessingGuarantee = setting("processing.guarantee", "enum", "at_least_once", "Commit offsets after output is acknowledged, or one transaction per commit.", choices=_GUARANTEES)
    allow_unsafe_producer_settings: bool = setting("allow.unsafe.producer.settings", "bool", False, "Under `at_least_once`, accept `producer.acks` 0 or 1 and `producer.enable.idempotence=false`, which are refused otherwise: with `acks=0` the producer never hears whether output arrived and with `acks=1` output a partition leader acknowledged is lost if the leader fails before replicating it (either way input offsets are committed past output that is gone), and without idempotence a retried batch can be duplicated or land behind a later one. Under `exactly_once_v2` these settings are always refused.")
    commit_interval_ms: int = setting("commit.interval.ms", "int", _commit_interval_default, f"How often (ms) to commit offsets or the transaction. {_WAIT_DOC}", min=0, max=JAVA_LONG_MAX, clamp=MAX_WAIT_MS, default_doc="`30000`; `100` with `exactly_once_v2`")
    buffered_records_per_partition: int = setting("buffered.records.per.partition", "int", 5000, "Input records buffered per partition before the partition is paused (it resumes at half; while named queries of different `query.<name>.priority` run, once 500 records fit, so a CPU-bound query's backlog refills in small bursts that a higher-priority record does not wait behind). The pause follows the `consume()` batch that reached the bound, so one partition can hold up to this - 1 + `max.poll.records` records (500 and 1000: 1,499), and memory is bounded by that per assigned partition.", min=1, max=JAVA_INT_MAX)
    task_timeslice_ms: int = setting("task.timeslice.ms", "int", 100, f"How long (ms) a processing thread keeps one task before giving others a turn. {_WAIT_DOC}", min=1, max=JAVA_LONG_MAX, clamp=MAX_WAIT_MS)
    gil_switch_interval_us: int = setting("gil.switch.interval.us", "int", 0, "If above 0, `App.start` sets CPython's `sys.setswitchinterval` to this many microseconds, for the whole process (the process's own comes back when the app stops). A thread waiting for the GIL held by a CPU-bound one (the polling thread beside a CPU-heavy query) waits up to this long for each turn, at the cost of more hand-overs between CPU-bound threads; measured effect: see the docs, Several queries. 0: automatic: 100 while named queries of different `query.<name>.priority` run (at start, `add_query`, `remove_query`), else Python's own (5000).", min=0, max=1_000_000)
    sched_idle_lower_priorities: bool = setting("sched.idle.lower.priorities", "bool", False, "While named queries of different `query.<name>.priority` run, a processing thread runs a lower-priority query's task in Linux's SCHED_IDLE class (back to normal for a higher one): the polling thread, client threads and a co-located broker preempt it at once. Measured beside a CPU-bound query (queries benchmark, 2 cores): the higher query's p99 latency 9.8 ms against 11.0 ms without (medians of 15 and 10 runs, the broker on the other core; 6.0 ms alone), 8.1 ms with a processing thread the lower query may not take (`query.<name>.max.threads`); with the broker sharing both cores 11.7 against 16.5 ms, the CPU-bound query's throughput 3-7% lower. Off by default for its risk: on a host whose cores other processes saturate, such a thread holding the GIL waits long for a core, and the whole process with it (inside a container's own cgroup it competes with the container's threads only). Needs a thread to be allowed back to the normal class (root, CAP_SYS_NICE or `ulimit -e 20`); otherwise it stays off and the app logs `sched_idle_lower_priorities_off`.")
    num_threads_per_task: int = setting("num.threads.per.task", "int", 1, "Most processing threads that may work on one task (one partition) at once, on different keys: records of one key (its serialized bytes; records without a key form one key) are processed one at a time in offset order, other keys in parallel (key-parallel mode; see the docs). 1: one thread per task, the default code path.", min=1, max=THREADS_CEILING)
    processing_retry_attempts: int = setting("processing.retry.attempts", "int", 0, "Times a record whose processing raised is tried again before `processing.exception.handler` decides; other keys of the partition flow on meanwhile, the record's key waits. Above 0 it puts tasks in key-parallel mode even with `num.threads.per.task` = 1.", min=0, max=JAVA_INT_MAX)
    processing_retry_backoff_ms: int = setting("processing.retry.backoff.ms", "int", 100, f"Wait (ms) before the first retry of a failed record; doubled for each further one. {_WAIT_DOC}", min=0, max=JAVA_LONG_MAX, clamp=MAX_WAIT_MS)
    processing_retry_backoff_max_ms: int = setting("processing.retry.backoff.max.ms", "int", 10000, f"Longest wait (ms) between two retries of a record. {_WAIT_DOC}", min=0, max=JAVA_LONG_MAX, clamp=MAX_WAIT_MS)
    max_poll_records: int = setting("max.poll.records", "int", 1000, "Records per `consume()` batch of the polling thread; at most 1000000 (confluent-kafka's limit for one batch). Unset, it is 200 while named queries of different `query.<name>.priority` run (a higher-priority record waits for one batch of the others' records to be routed ahead of it).", min=1, max=1_000_000)
    poll_ms: int = setting("poll.ms", "int", 100, f"How long (ms) the polling thread blocks waiting for input. {_WAIT_DOC}", min=0, max=JAVA_LONG_MAX, clamp=MAX_WAIT_MS)
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
        return _build(d, {})

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
        return _build(raw, {})

    def as_display_dict(self) -> dict[str, Any]:
        """Effective values under their dotted keys; serdes by name, secrets masked."""
        out: dict[str, Any] = {}
        for spec in KEYS.values():
            value = getattr(self, spec.attr)
            if spec.kind == "serde":
                value = _serde_name(value, self.raw.get(spec.name))
            elif spec.kind == "partitioner" and value is not None:
                given = self.raw.get(spec.name)
                value = given if isinstance(given, str) else repr(value)
            out[spec.name] = value
        for query, settings in sorted(self.query_settings.items()):
            for setting_name, value in settings.items():
                out[f"query.{query}.{setting_name}"] = value
        for prefix, attr in _PASSTHROUGH_ATTRS:
            for prop, value in getattr(self, attr).items():
                out[prefix + prop] = "********" if _secret(prop) else value
        return out


KEYS: Mapping[str, ConfigKey] = {
    spec.name: replace(spec, attr=f.name)
    for f in fields(StreamsConfig)
    if (spec := f.metadata.get(_SPEC)) is not None
}
_KEY_BY_ATTR = {spec.attr: name for name, spec in KEYS.items()}
_PASSTHROUGH_ATTRS: tuple[tuple[str, str], ...] = tuple(
    (f.metadata[_PREFIX][0], f.name) for f in fields(StreamsConfig) if _PREFIX in f.metadata
)
_PASSTHROUGH_DOCS = {
    f.name: f.metadata[_PREFIX][1] for f in fields(StreamsConfig) if _PREFIX in f.metadata
}
_PREFIX_BY_ATTR = {attr: prefix for prefix, attr in _PASSTHROUGH_ATTRS}
# Longest first, so `restore.consumer.x` is not taken for `consumer.`.
_ROUTES = sorted(_PASSTHROUGH_ATTRS, key=lambda pa: len(pa[0]), reverse=True)
PASSTHROUGH_PREFIXES: tuple[str, ...] = tuple(prefix for prefix, _ in _PASSTHROUGH_ATTRS)


# Named queries (`App({"name": topology, ...})`): one family of keys per
# query, `query.<name>.<setting>`, parsed like the keys above.
_QUERY_KEY = re.compile(r"query\.([A-Za-z0-9_-]{1,64})\.(.+)", re.ASCII)
QUERY_SETTINGS: Mapping[str, ConfigKey] = {
    "priority": ConfigKey(
        "query.<name>.priority",
        "int",
        0,
        "Scheduling priority of the named query: a free processing thread serves the highest "
        "priority query that has work first, whatever the others wait for.",
        min=-1000,
        max=1000,
    ),
    "weight": ConfigKey(
        "query.<name>.weight",
        "int",
        1,
        "Share of processing time among queries of equal priority that have work: busy time "
        "comes out in proportion to the weights (weighted fair sharing, measured in busy time, "
        "not records).",
        min=1,
        max=10000,
    ),
    "max.threads": ConfigKey(
        "query.<name>.max.threads",
        "int",
        None,
        "Most processing threads working on the named query's tasks at once; unset: no cap.",
        min=1,
        max=THREADS_CEILING,
        nullable=True,
    ),
    "isolation": ConfigKey(
        "query.<name>.isolation",
        "enum",
        "thread",
        "`thread`: the named query shares the daemon's clients, processing threads and GIL with "
        "the others. `process`: it runs in a child process of its own (its own clients, threads "
        "and GIL, consumer group `<application.id>-<name>`, `query.<name>.max.threads` threads, "
        "niceness `query.<name>.nice`), so a CPU-bound query cannot delay the others' records "
        "and a crash in it stops it alone; its status, pause/resume and removal go through the "
        "daemon. The topology must be importable: `streams-runtime run` passes its MODULE:ATTR, "
        "a library user gives `App(..., source='module:attr')`. At least one query stays in the "
        "daemon's process. Measured beside a CPU-bound query (queries benchmark, 2 cores): the "
        "higher-priority query's p99 latency 6.9 ms (median of 13 runs, all within 1.5x of "
        "alone's 6.0 ms) against 11.0 ms with both in one process.",
        choices=("thread", "process"),
    ),
    "nice": ConfigKey(
        "query.<name>.nice",
        "int",
        None,
        "Niceness the child process of a `query.<name>.isolation=process` query adds to its own "
        "(0-19; higher yields the CPU to the other queries). Unset: 19 if another query has a "
        "higher `query.<name>.priority`, else 0.",
        min=0,
        max=19,
        nullable=True,
    ),
}


def _query_setting(key: str, value: Any) -> tuple[str, str, Any]:
    """`(query, setting, parsed value)` of a `query.<name>.<setting>` key; raises ConfigError."""
    match = _QUERY_KEY.fullmatch(key)
    if match is None:
        raise ConfigError(
            key,
            "a query setting is query.<name>.<setting>, the name 1-64 of letters, digits, "
            f"'_' or '-', the setting one of {', '.join(QUERY_SETTINGS)}",
        )
    name, setting_name = match.groups()
    spec = QUERY_SETTINGS.get(setting_name)
    if spec is None:
        close = close_match(setting_name, list(QUERY_SETTINGS))
        hint = f" (did you mean {close!r}?)" if close else ""
        raise ConfigError(key, f"unknown query setting{hint}; one of {', '.join(QUERY_SETTINGS)}")
    try:
        return name, setting_name, spec.parse(value)
    except _Invalid as exc:
        raise ConfigError(key, exc.reason) from None


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
    if value is None or _secret(key):
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


# Client properties the runtime sets itself and that must not be overridden. A
# consumer's group.id: the group is application.id (offsets, fencing, the
# status topic all depend on it); and confluent-kafka aborts the whole process
# (a C assertion, SIGABRT) building a consumer whose group.id is empty.
_RUNTIME_OWNED: Mapping[str, Mapping[str, str]] = {
    "consumer_overrides": {
        "group.id": "set by the runtime: the consumer group is application.id",
    },
    "restore_consumer_overrides": {
        "group.id": "set by the runtime (the restore consumer never joins a group)",
    },
    # Under exactly_once_v2 the runtime keeps one per instance in state.dir,
    # so a restarted instance fences its crashed predecessor and aborts its
    # open transaction; one shared by two instances fences them in turn, and
    # under at_least_once a transactional producer refuses every record sent
    # outside a transaction (issue 31).
    "producer_overrides": {
        "transactional.id": (
            "set by the runtime: under exactly_once_v2 each instance keeps its own in "
            "state.dir (a restarted instance fences its crashed predecessor with it); "
            "under at_least_once the producer is not transactional. Remove the key"
        ),
    },
}

_CAPPED_BY_THREADS_LIMIT = (
    "processing.threads",
    "processing.threads.min",
    "processing.threads.max",
)


def _passthrough_value_problem(prop: str, value: Any) -> str | None:
    """Why a client property value cannot reach librdkafka, or None if it can.

    Only the type is checked here; whether librdkafka takes the value is checked
    at start-up by building the clients (`runtime.kafka.startup_checks`).
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        if abs(value) > JAVA_LONG_MAX:
            return f"client property value {show_value(value)} is out of range"
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"client property value {value} is not finite"
    if isinstance(value, str):
        if "\x00" in value:
            return f"client property value contains a NUL character: {show_value(value)}"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"client property value is not valid UTF-8 text: {show_value(value)}"
        if prop in ("bootstrap.servers", "metadata.broker.list"):
            try:
                check_bootstrap_servers(value)
            except _Invalid as exc:
                return exc.reason
        if _names_or_path(prop) and any(is_control(c) for c in value):
            # Client ids reach broker logs and metrics labels, locations are
            # file names: a newline there forges lines (PEM text, which has
            # newlines, is given in the *.pem properties instead).
            return f"client property value contains control characters: {show_value(value)}"
        return None
    return (
        "a client property takes a string, number or boolean, got "
        f"{type(value).__name__} {show_value(value)}"
    )


def _names_or_path(prop: str) -> bool:
    """A client property whose value is an id or a file path (no control characters)."""
    return prop in ("client.id", "group.instance.id", "client.rack") or prop.endswith(
        (".location", ".dir", ".path")
    )


# Client properties the runtime's guarantees depend on (issue 31, item 7).
#
# Overrides are passed to librdkafka after the runtime's own settings, so
# before this check `consumer.isolation.level=read_uncommitted` under
# exactly_once_v2 was accepted and over-counted 161 of 250 keys through ten
# SIGKILLs (the restore consumer's: 402 of 1,000). Each rule below names the
# property, why the runtime needs it and what to do; a refused setting stops
# the config from being built (exit 2 from the CLI, ConfigError from `App`).

_CLIENT_ATTRS: tuple[str, ...] = (
    "consumer_overrides",
    "producer_overrides",
    "restore_consumer_overrides",
    "admin_overrides",
)

# librdkafka's other names for the properties checked here. Topic-level
# properties may also be given with a "topic." prefix (librdkafka strips it):
# `producer.topic.acks=0` is `acks=0`.
_ALIASES: Mapping[str, str] = {
    "request.required.acks": "acks",
    "topic.acks": "acks",
    "topic.request.required.acks": "acks",
    "max.in.flight.requests.per.connection": "max.in.flight",
    "metadata.broker.list": "bootstrap.servers",
    "sasl.mechanisms": "sasl.mechanism",
}


def _canonical(prop: str) -> str:
    return _ALIASES.get(prop, prop)


def is_security_property(prop: str) -> bool:
    """Whether a librdkafka property says how to reach and authenticate to the
    cluster: these must be the same for the four clients, and may be given
    unprefixed (`security.protocol`, `sasl.*`, `ssl.*`) for all of them."""
    prop = _canonical(prop)
    return (
        prop == "security.protocol"
        or prop.startswith(("sasl.", "ssl."))
        or prop in ("enable.ssl.certificate.verification", "enable.sasl.oauthbearer.unsecure.jwt")
    )


def _secret(prop: str) -> bool:
    """Properties whose values never appear in messages or `as_display_dict`."""
    return any(w in prop.lower() for w in ("password", "secret", "key.pem", "oauthbearer.config"))


def _shown(prop: str, value: Any) -> str:
    return "(hidden)" if _secret(prop) else show_value(value)


def _rdkafka_bool(value: Any) -> bool | None:
    """A boolean as librdkafka reads it (true/t/1, false/f/0), or None when it
    would refuse the value (the start-up check then names the key)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "t", "1"):
        return True
    if text in ("false", "f", "0"):
        return False
    return None


def _rdkafka_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip()
    return int(text) if _INT_TEXT.fullmatch(text) and len(text) <= MAX_INT_DIGITS else None


def _acks(value: Any) -> str:
    """`acks` normalised: "all" for all/-1 (librdkafka takes both, any case)."""
    text = str(value).strip().lower()
    return "all" if text in ("all", "-1") else text


_COMMITS_OFFSETS = (
    "the runtime commits offsets itself, only after the output of the records before them "
    "is acknowledged (under exactly_once_v2: inside the transaction); automatic commits or "
    "offset stores would move them ahead of that, and records are lost after a crash"
)


def _guarantee_problem(
    attr: str, prop: str, value: Any, exactly_once: bool, allow_unsafe: bool
) -> str | None:
    """Why the client property `prop` (of the clients under `attr`) breaks the
    processing guarantee, or None. Pure; `_build` runs it for every override."""
    canon = _canonical(prop)
    consumer = attr in ("consumer_overrides", "restore_consumer_overrides")
    if consumer and canon in ("enable.auto.commit", "enable.auto.offset.store"):
        if _rdkafka_bool(value) is True:
            return f"{_COMMITS_OFFSETS}; remove it (the runtime always sets false)"
        return None
    if attr == "restore_consumer_overrides" and canon == "enable.partition.eof":
        if _rdkafka_bool(value) is False:
            return (
                "the restoration thread learns that a changelog is restored from the end-of-"
                "partition event; without it no stateful task ever finishes restoring. Remove it"
            )
        return None
    if consumer and canon == "isolation.level" and exactly_once:
        if str(value).strip().lower() != "read_committed":
            what = (
                "input" if attr == "consumer_overrides" else "the state it restores from changelogs"
            )
            return (
                f"exactly_once_v2 reads {what} with read_committed: any other level hands "
                "over records of aborted transactions (the output of a crashed attempt, "
                "which is then counted twice). Remove it, or set read_committed"
            )
        return None
    if attr != "producer_overrides":
        return None
    if canon == "acks":
        acks = _acks(value)
        if acks == "all":
            return None
        if exactly_once:
            return (
                "exactly_once_v2 needs acks=all (transactions use the idempotent producer, "
                "and output not yet replicated can be lost with its partition leader). "
                "Remove it, or set all"
            )
        if acks in ("0", "1") and not allow_unsafe:
            loss = (
                "with acks=0 the producer never learns whether output arrived"
                if acks == "0"
                else "with acks=1 output the partition leader acknowledged is lost if the "
                "leader fails before replicating it"
            )
            return (
                f"{loss}, and at_least_once commits input offsets past it. Remove it (the "
                "default is all), or confirm the loss with allow.unsafe.producer.settings=true "
                "and producer.enable.idempotence=false (librdkafka's idempotent producer "
                "needs acks=all)"
            )
        return None
    if canon == "enable.idempotence":
        if _rdkafka_bool(value) is not False:
            return None
        if exactly_once:
            return (
                "exactly_once_v2 needs the idempotent producer (transactions are built on "
                "it). Remove it"
            )
        if not allow_unsafe:
            return (
                "without idempotence a retried batch can be written twice or land behind a "
                "later one, breaking the output order of a partition. Remove it (the runtime "
                "sets true), or confirm with allow.unsafe.producer.settings=true"
            )
        return None
    if canon == "max.in.flight":
        number = _rdkafka_int(value)
        if number is not None and number > 5 and exactly_once:
            return (
                "exactly_once_v2's idempotent producer keeps order with at most 5 requests "
                "in flight per connection. Set 1 to 5, or remove it"
            )
    return None


def _check_client_guarantees(
    overrides: Mapping[str, Mapping[str, Any]],
    values: Mapping[str, Any],
    source: Callable[[str], str],
) -> None:
    """Refuse client properties that break the processing guarantee (see above)."""
    exactly_once = values["processing.guarantee"] == "exactly_once_v2"
    allow_unsafe = bool(values["allow.unsafe.producer.settings"])
    for attr in _CLIENT_ATTRS:
        prefix = _PREFIX_BY_ATTR[attr]
        for prop, value in overrides[attr].items():
            if value is None:
                continue
            reason = _guarantee_problem(attr, prop, value, exactly_once, allow_unsafe)
            if reason is not None:
                key = prefix + prop
                raise ConfigError(key, f"{_shown(prop, value)} refused: {reason}{source(key)}")


_ONE_CLUSTER = (
    "the runtime's four clients must reach one cluster the same way (the producer commits "
    "the consumer's offsets, the restore consumer reads what the producer wrote), and one "
    "that cannot connect hangs or fails only after start-up"
)


def _servers(value: Any) -> list[str]:
    """A broker list for comparison: entries stripped, lower-cased, sorted."""
    return sorted(entry.strip().lower() for entry in str(value).split(",") if entry.strip())


def _check_one_cluster(
    shared: Mapping[str, Any],
    overrides: dict[str, dict[str, Any]],
    bootstrap_servers: str,
    source: Callable[[str], str],
) -> None:
    """Refuse connection settings that differ between the four clients, then
    give each client the unprefixed security settings (`shared`).

    A prefixed `bootstrap.servers` must name the same brokers as the
    unprefixed one; a security property (`is_security_property`) must have
    the same value, or be unset, for all four clients. Refusing here is the
    fix for settings given to one client only: a producer alone with
    `producer.security.protocol=SASL_SSL` started, and the other clients
    hung at the group join or the first admin request (issue 31)."""
    names = {
        "consumer_overrides": "consumer",
        "producer_overrides": "producer",
        "restore_consumer_overrides": "restore consumer",
        "admin_overrides": "admin client",
    }
    prefixes = ", ".join(_PREFIX_BY_ATTR[a] for a in _CLIENT_ATTRS)
    # Each client's value of each security property: prefixed, else unprefixed.
    effective: dict[str, dict[str, tuple[str, Any]]] = {attr: {} for attr in _CLIENT_ATTRS}
    for prop, value in shared.items():
        for attr in _CLIENT_ATTRS:
            effective[attr][_canonical(prop)] = (prop, value)
    for attr in _CLIENT_ATTRS:
        prefix = _PREFIX_BY_ATTR[attr]
        for prop, value in overrides[attr].items():
            if value is None:
                continue
            canon = _canonical(prop)
            key = prefix + prop
            if canon == "bootstrap.servers":
                if _servers(value) != _servers(bootstrap_servers):
                    raise ConfigError(
                        key,
                        f"{show_value(value)} differs from bootstrap.servers "
                        f"({show_value(bootstrap_servers)}): {_ONE_CLUSTER}. Set "
                        f"bootstrap.servers alone (unprefixed) for all clients{source(key)}",
                    )
            elif is_security_property(canon):
                if canon in effective[attr] and effective[attr][canon][0] in shared:
                    unprefixed = effective[attr][canon]
                    if _comparable(canon, unprefixed[1]) != _comparable(canon, value):
                        raise ConfigError(
                            key,
                            f"{_shown(prop, value)} differs from the unprefixed "
                            f"{unprefixed[0]} ({_shown(prop, unprefixed[1])}): {_ONE_CLUSTER}. "
                            f"Remove {key} and keep the unprefixed one{source(key)}",
                        )
                effective[attr][canon] = (prop, value)
    security = sorted({canon for attr in _CLIENT_ATTRS for canon in effective[attr]})
    for canon in security:
        seen = {
            attr: _comparable(canon, effective[attr][canon][1])
            if canon in effective[attr]
            else None
            for attr in _CLIENT_ATTRS
        }
        if len(set(seen.values())) == 1:
            continue
        # Name the first client whose own (prefixed) setting makes the difference.
        attr = next(a for a in _CLIENT_ATTRS if seen[a] is not None)
        prop = effective[attr][canon][0]
        key = _PREFIX_BY_ATTR[attr] + prop
        # Clients grouped by value, each value shown as first given.
        groups: dict[str | None, tuple[str, list[str]]] = {}
        for a in _CLIENT_ATTRS:
            shown = "unset" if seen[a] is None else _shown(canon, effective[a][canon][1])
            groups.setdefault(seen[a], (shown, []))[1].append(names[a])
        found = "; ".join(
            f"{shown} for the {' and '.join(clients)}" for shown, clients in groups.values()
        )
        raise ConfigError(
            key,
            f"differs between clients ({found}): {_ONE_CLUSTER}. Set {canon} unprefixed "
            f"(it then applies to every client), or the same under every prefix "
            f"({prefixes}){source(key)}",
        )
    for attr in _CLIENT_ATTRS:
        given = {_canonical(p) for p, v in overrides[attr].items() if v is not None}
        for prop, value in shared.items():
            if _canonical(prop) not in given:
                overrides[attr][prop] = value


def _comparable(canon: str, value: Any) -> str:
    """A security value for comparison: enum-like ones ignore case and spaces."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value).strip()
    if canon in ("security.protocol", "sasl.mechanism") or canon.startswith("enable."):
        return text.lower()
    return text


def _build(given: Mapping[str, Any], sources: Mapping[str, str]) -> StreamsConfig:
    """Validate `given` into a `StreamsConfig`; `sources` says where keys came from."""

    def source(key: str) -> str:
        return f" (from {sources[key]})" if key in sources else ""

    known: dict[str, Any] = {}
    overrides: dict[str, dict[str, Any]] = {attr: {} for _, attr in _PASSTHROUGH_ATTRS}
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
                reason = _passthrough_value_problem(key, value)
                if reason is not None:
                    raise ConfigError(key, reason + source(key))
                shared[key] = value
            continue
        if key.startswith("query."):
            if value is not None:
                try:
                    name, setting_name, parsed = _query_setting(key, value)
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
        if prop in _RUNTIME_OWNED.get(attr, ()):
            raise ConfigError(key, _RUNTIME_OWNED[attr][prop] + source(key))
        if value is not None:
            reason = _passthrough_value_problem(prop, value)
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

    _check_client_guarantees(overrides, values, source)
    _check_one_cluster(shared, overrides, values["bootstrap.servers"], source)

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


# Loading: base < TOML file < environment < --set


def _flatten(table: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The document's settings, nested tables flattened to dotted keys.

    Iterative, and no deeper than MAX_CONFIG_NESTING tables and arrays (a
    value nested deeper is refused here, before anything recurses into it:
    the validation of a key, `repr` in a message, `==`)."""
    settings: dict[str, Any] = {}
    # Depth first, in the document's order: (prefix, the table's items left).
    stack: list[tuple[str, Iterator[tuple[str, Any]]]] = [("", iter(table.items()))]
    while stack:
        prefix, items = stack[-1]
        entry = next(items, None)
        if entry is None:
            stack.pop()
            continue
        key, value = entry
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if len(stack) >= MAX_CONFIG_NESTING:
                raise ConfigError(
                    "", f"tables nested more than {MAX_CONFIG_NESTING} deep", file=path
                )
            stack.append((dotted + ".", iter(value.items())))
            continue
        if _nesting(value) > MAX_CONFIG_NESTING:
            raise ConfigError(
                dotted, f"nested more than {MAX_CONFIG_NESTING} deep (in file {path!r})"
            )
        if dotted in settings:
            raise ConfigError(dotted, f"set twice in {path!r}")
        settings[dotted] = value
    return settings


def _nesting(value: Any) -> int:
    """How deep arrays and inline tables nest in a TOML value (iteratively)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, list | dict):
            depth += 1
            deepest = max(deepest, depth)
            if depth > MAX_CONFIG_NESTING:
                return depth
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth) for child in children)
    return deepest


def _read_config_file(path: str) -> bytes:
    """The bytes of the `--config` file: a regular file of at most
    MAX_CONFIG_FILE_BYTES, else a `ConfigError`.

    Opened non-blocking, so a FIFO with no writer does not hang the open, and
    refused unless `fstat` says it is a regular file: `/dev/zero`, `/dev/stdin`,
    a pipe or a directory never reach `read`. The read itself is bounded too
    (a regular file may grow, and /proc files report size 0)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError("", f"cannot read: {exc.strerror or exc}", file=path) from None
    except ValueError as exc:  # an embedded NUL: no path the OS can open
        raise ConfigError("", f"cannot read: {exc}", file=path) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "a device, pipe or socket"
            raise ConfigError(
                "", f"is {kind}, not a regular file: give the path of a TOML file", file=path
            )
        limit = MAX_CONFIG_FILE_BYTES
        too_big = (
            f"larger than {limit // (1024 * 1024)} MiB; a config file is a few kilobytes of TOML"
        )
        if info.st_size > limit:
            raise ConfigError("", f"{too_big} ({info.st_size} bytes)", file=path)
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise ConfigError("", too_big, file=path)
        return b"".join(chunks)
    except OSError as exc:
        raise ConfigError("", f"cannot read: {exc.strerror or exc}", file=path) from None
    finally:
        os.close(fd)


def _read_toml(path: str) -> dict[str, Any]:
    """The file's settings, nested tables flattened to dotted keys. Any bad
    file is a `ConfigError` (exit 2), never a traceback or a hang."""
    data = _read_config_file(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            "", f"not UTF-8 text (byte {exc.start}): TOML files are UTF-8", file=path
        ) from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"not valid TOML: {exc}", file=path) from None
    except RecursionError:
        # tomllib parses arrays and inline tables by recursion: about 600
        # levels of `[[[...` exhaust Python's stack.
        raise ConfigError(
            "", f"arrays or tables nested more than {MAX_CONFIG_NESTING} deep", file=path
        ) from None
    return _flatten(document, path)


def _env_settings(env: Mapping[str, str]) -> Iterator[tuple[str, str, str]]:
    """(key, value, variable) for each STREAMS_RUNTIME_<KEY> variable."""
    for variable, value in env.items():
        if variable.startswith(ENV_PREFIX) and len(variable) > len(ENV_PREFIX):
            key = variable[len(ENV_PREFIX) :].lower().replace("_", ".")
            yield key, value, variable


def _parse_set(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(item, "--set expects key=value")
    return key.strip(), value


def load_config(
    toml_path: str | None = None,
    sets: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    base: Mapping[str, Any] | None = None,
) -> StreamsConfig:
    """Merge and validate the configuration; later sources win.

    Order: `base` (e.g. the dict given to `App`), the TOML file (nested tables
    flattened: `[consumer]` holds `consumer.*` keys), `STREAMS_RUNTIME_<KEY>`
    environment variables (`_` becomes `.`; `env` defaults to `os.environ`),
    then `--set key=value` strings. Raises `ConfigError`.
    """
    merged: dict[str, Any] = dict(base or {})
    sources: dict[str, str] = {}

    def put(key: str, value: Any, where: str) -> None:
        merged[key] = value
        sources[key] = where

    if toml_path is not None:
        for key, value in _read_toml(toml_path).items():
            put(key, value, f"file {toml_path}")
    for key, value, variable in _env_settings(os.environ if env is None else env):
        put(key, value, f"environment variable {variable}")
    for item in sets:
        key, value = _parse_set(item)
        shown = item if len(item) <= 100 else f"{item[:60]}... ({len(item)} characters)"
        put(key, value, f"--set {shown}")
    return _build(merged, sources)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def config_table_markdown() -> str:
    """The configuration table (Markdown) of docs/configuration.md, generated from `KEYS`."""
    rows = ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for spec in KEYS.values():
        cells = (f"`{spec.name}`", spec.type_doc(), spec.default_doc_text(), spec.doc)
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    for spec in QUERY_SETTINGS.values():
        cells = (f"`{spec.name}`", spec.type_doc(), spec.default_doc_text(), spec.doc)
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    for prefix, attr in _PASSTHROUGH_ATTRS:
        cells = (f"`{prefix}*`", "passed through", "", _PASSTHROUGH_DOCS[attr])
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    cells = ("`security.protocol`, `sasl.*`, `ssl.*`", "passed through", "", _SHARED_SECURITY_DOC)
    rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows) + "\n"


README_TABLE_START = "<!-- config table: generated from runtime/config.py by ./dev docs -->"
README_TABLE_END = "<!-- end of config table -->"


# The page that holds the generated table (the docs site's configuration
# reference; the README links to it and lists only the common keys).
CONFIG_TABLE_PAGE = "docs/configuration.md"


def readme_with_table(text: str) -> str:
    """`text` (a Markdown page: docs/configuration.md) with the config table
    between its markers regenerated. Raises ValueError if a marker is missing."""
    start = text.index(README_TABLE_START) + len(README_TABLE_START)
    end = text.index(README_TABLE_END, start)
    return text[:start] + "\n\n" + config_table_markdown() + "\n" + text[end:]


def update_config_table(path: str = CONFIG_TABLE_PAGE) -> bool:
    """Regenerate the config table in the page at `path` (by default
    docs/configuration.md, relative to the working directory; `./dev docs` runs
    from the repository's root); True if it changed."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    new = readme_with_table(text)
    if new != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
    return new != text


def update_readme(path: str = CONFIG_TABLE_PAGE) -> bool:
    """The former name of `update_config_table` (the table was in README.md
    until the docs site); same arguments and result."""
    return update_config_table(path)
