"""What `audit` and `backfill` check before they start Spark: that their topics exist.

Why: starting Spark costs from ten seconds to a minute (the JVM, the connector
on the classpath, a cold JIT), and both commands used to learn that a topic is
missing only once Spark was up: `audit` with a mistyped topic name took 62 s
to say "topic not available". One metadata request answers in milliseconds,
so the commands ask it first and fail with one line naming every missing
topic and the command that creates it (`streams-runtime topics create`, as
`run` says for a missing source topic), exit 2 (bad input), Spark never
started. The Spark jobs keep their own checks (`runtime.spark.kafka.
partitions_of`, `resolve_topics`): they also serve callers from Python, and a
topic can vanish between the check and the job.

The metadata comes from a short-lived AdminClient listing every topic (never
one topic by name: a producer-type client asking for a named topic can make a
broker with `auto.create.topics.enable` create it). A broker that does not
answer within `TIMEOUT_S` fails the check too: the job could not have run.

Nothing here imports PySpark. Runs on the CLI's main thread, before
`runtime.spark.session.spark_session`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from runtime.kafka.clients import admin_config
from runtime.kafka.topics import TopicError
from runtime.logging import librdkafka_logger
from runtime.spark.kafka import KafkaSourceError

if TYPE_CHECKING:
    from runtime.config import StreamsConfig
    from runtime.topology.topology import Topology

__all__ = [
    "TIMEOUT_S",
    "ClusterUnreachableError",
    "check_audit_topics",
    "check_backfill_topics",
    "missing_topics",
]

# How long a broker may take to answer at all. A missing topic is known as soon
# as it answers (plus `_SETTLE_S`); this bounds only an unreachable cluster.
TIMEOUT_S = 10.0
# A topic created a moment ago can be missing from the answering broker's
# metadata for a moment (KRaft brokers apply the controller's records
# asynchronously): a missing topic is looked for again for this long before
# it counts as missing. `partitions_of` waits 5 s for the same reason; 2 s is
# plenty for one broker's metadata to catch up and keeps the answer quick.
_SETTLE_S = 2.0
_SLICE_S = 1.0  # one list_topics call at most: Ctrl-C is served between calls

_CREATE = "streams-runtime topics create"


class ClusterUnreachableError(RuntimeError):
    """No broker answered a metadata request in time; `reason` is librdkafka's
    last connection error (`Connect to ... failed: Connection refused`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def missing_topics(
    settings: Mapping[str, Any],
    topics: Sequence[str],
    timeout: float = TIMEOUT_S,
    settle: float = _SETTLE_S,
) -> list[str]:
    """Those of `topics` the cluster does not have, in the order given.

    `settings`: an AdminClient configuration. Raises `ClusterUnreachableError` (with
    librdkafka's last connection error) when no broker answers within `timeout`.
    """
    errors: list[str] = []

    def on_error(error: KafkaError) -> None:
        # "1/1 brokers are down" says less than the connection error before it.
        if error.code() != KafkaError._ALL_BROKERS_DOWN or not errors:
            errors.append(error.str())

    config: dict[str, Any] = {**settings, "error_cb": on_error}
    admin = AdminClient(config)
    deadline = time.monotonic() + timeout
    settled_by: float | None = None
    while True:
        try:
            metadata = admin.list_topics(
                timeout=max(0.1, min(_SLICE_S, deadline - time.monotonic()))
            )
        except KafkaException as exc:
            admin.poll(0)  # serves the error callback
            if time.monotonic() >= deadline:
                raise ClusterUnreachableError(errors[-1] if errors else _text(exc)) from None
            continue
        # A listed topic exists, even if it reports an error for now
        # (a new topic's leader not elected yet): that is the job's to wait for.
        missing = [t for t in dict.fromkeys(topics) if t not in metadata.topics]
        now = time.monotonic()
        if settled_by is None:
            settled_by = now + settle
        if not missing or now >= settled_by:
            return missing
        time.sleep(0.2)


def _text(exc: KafkaException) -> str:
    error: Any = exc.args[0] if exc.args else None
    return str(error.str()) if hasattr(error, "str") else str(exc)


def check_audit_topics(
    bootstrap: str,
    input_topic: str,
    output_topic: str,
    timeout: float = TIMEOUT_S,
) -> None:
    """`KafkaSourceError` (the audit's bad-input error, exit 2) naming the missing
    topic(s) of an audit and how to create them, or that no broker answered."""
    settings = {
        "bootstrap.servers": bootstrap,
        "client.id": "streams-runtime-audit-preflight",
        "log.connection.close": False,
        # librdkafka's per-attempt connection lines go to debug, not to stderr.
        "logger": librdkafka_logger(),
    }
    try:
        missing = missing_topics(settings, [input_topic, output_topic], timeout)
    except ClusterUnreachableError as exc:
        raise KafkaSourceError(
            f"cannot reach the Kafka cluster at {bootstrap!r} within {timeout:.0f} s "
            f"({exc.reason}): check --bootstrap and that the broker is running"
        ) from None
    if not missing:
        return
    roles = {output_topic: "output", input_topic: "input"}  # input wins if they are one
    named = " and ".join(f"{roles[t]} topic {t!r}" for t in missing)
    verb, them = ("does", "it") if len(missing) == 1 else ("do", "them")
    # The audit knows topic names only, not the topology: MODULE:ATTR is the
    # user's to fill in, as in `run`'s own hint.
    raise KafkaSourceError(
        f"{named} {verb} not exist at {bootstrap}: create {them} with `{_CREATE} MODULE:ATTR "
        f"--partitions N`, MODULE:ATTR naming the topology that reads and writes {them} "
        "(or check --bootstrap and the topic names)"
    )


def check_backfill_topics(
    topology: Topology,
    config: StreamsConfig,
    target: str,
    timeout: float = TIMEOUT_S,
) -> None:
    """`TopicError` (exit 2) naming the topology's missing source and output
    topics, as `run` names them, and the `topics create` command for `target`
    (MODULE:ATTR); or that no broker answered.

    Only user topics are checked: the backfill creates the internal topics and
    changelogs (and the dead-letter topic) itself, as the daemon does.
    """
    # topic -> (role, subtopology id): a `through` topic is an output of one
    # subtopology and a source of the next, and is named as both (as `run` does).
    roles: dict[str, list[tuple[str, int]]] = {}
    for sub in topology.subtopologies:
        for kind, specs in (("source", sub.sources), ("output", sub.sinks)):
            for spec in specs:
                if not spec.internal:
                    roles.setdefault(spec.name, []).append((kind, sub.id))
    if not roles:
        return
    try:
        missing = missing_topics(admin_config(config), list(roles), timeout)
    except ClusterUnreachableError as exc:
        raise TopicError(
            f"cannot reach the Kafka cluster at bootstrap.servers={config.bootstrap_servers!r} "
            f"within {timeout:.0f} s ({exc.reason}): check bootstrap.servers and that the broker "
            "is running"
        ) from None
    if not missing:
        return
    problems = [
        f"{kind} topic {t!r} (subtopology {sid}) does not exist"
        for t in missing
        for kind, sid in roles[t]
    ]
    # No `topics.create.missing=true` here, unlike `run`'s hint: that setting
    # is the daemon's; a backfill never creates the user's topics.
    problems.append(
        f"create them with `{_CREATE} {target} --partitions N` (same --config/--set as "
        "the backfill)"
    )
    raise TopicError("; ".join(problems))
