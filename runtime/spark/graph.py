"""The backfill's worker side: the runtime's own nodes, run over Arrow batches.

A `StageRunner` wires one subtopology's nodes exactly as a task does
(`NodeDef.make`, children in order, `init` with a context), so every DSL step
keeps its runtime semantics: serdes, null-key filtering before repartition
topics, branch order, custom partitioners. Two things differ from a task:

- the context (`BackfillContext`) collects output rows instead of handing
  them to a record collector, and numbers them (`order`) so later stages can
  keep per-partition order;
- each aggregation node is an `AggregateStandIn`. In the input pass it
  captures `(task, key bytes, window start, value)` instead of touching a
  store (late records beyond grace are dropped there, as the window node
  would); in the result pass it receives the final aggregate of each key or
  window and forwards it downstream like the store's flush would, and writes
  the changelog record a daemon restores from.

Three passes per stage, each a generator over Arrow batches that Spark calls
through `mapInArrow`: `input_pass` (stage input -> OUTPUT rows), `fold_pass`
(captured values sorted by key and order -> one RESULT row per key/window, for
`reduce`/`aggregate`), `result_pass` (RESULT rows -> OUTPUT rows). A `count`
is folded by Spark SQL instead (`runtime.spark.backfill`).

Runs inside Spark's Python workers (and in unit tests); one runner per
Arrow partition, single-threaded.

Over 500 lines as one thing: the context, the stand-in and the three passes
share the one record layout (OUTPUT and RESULT rows) defined here.
"""

from __future__ import annotations

import pickle
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from runtime.partitioning.default import default_partition
from runtime.processing.errors import (
    DEAD_LETTER_QUEUE,
    LOG_AND_CONTINUE,
    dead_letter_headers,
)
from runtime.spark.plan import AggregateSpec, BackfillError, BackfillPlan, StagePlan
from runtime.topology.context import PunctuationType
from runtime.topology.graph import NodeDef, NodeKind
from runtime.topology.nodes import Node, SourceNode, resolve_serde
from runtime.topology.record import Headers, Record
from runtime.topology.stateful_nodes import MISSING
from runtime.topology.windows import Windowed

KIND_RECORD = 0  # a record for a topic (output, changelog, through, repartition)
KIND_CAPTURE = 1  # a value that reached an aggregation
KIND_STREAM_TIME = 2  # the largest timestamp a task saw (for window retention)

_HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)
_ORDER = ArrayType(LongType())

# The stage input: a Kafka record of a topic the stage reads, from history or
# handed on by an earlier stage. `partition` is the task; `order` sorts the
# records of a task in an order the daemon could have processed them;
# `stream_time` is the task's stream time at this record (-1: not computed).
INPUT_SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("timestamp", LongType()),
        StructField("headers", _HEADERS),
        StructField("order", _ORDER),
        StructField("stream_time", LongType()),
    ]
)
OUTPUT_SCHEMA = StructType(
    [
        StructField("kind", IntegerType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("window_start", LongType()),
        StructField("timestamp", LongType()),
        StructField("headers", _HEADERS),
        StructField("order", _ORDER),
        StructField("agg", IntegerType()),
    ]
)
# The final aggregate of one key (or key and window) of one task. `value` is
# the serialized aggregate (null: deleted), or null with `count` set for a count.
RESULT_SCHEMA = StructType(
    [
        StructField("agg", IntegerType()),
        StructField("partition", IntegerType()),
        StructField("key", BinaryType()),
        StructField("window_start", LongType()),
        StructField("value", BinaryType()),
        StructField("count", LongType()),
        StructField("timestamp", LongType()),
    ]
)

Row = tuple[Any, ...]


def arrow_schema(schema: StructType) -> Any:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def _to_batch(rows: list[Row], schema: Any) -> Any:
    import pyarrow as pa

    columns = list(zip(*rows, strict=True)) if rows else [()] * len(schema)
    return pa.RecordBatch.from_arrays(
        [pa.array(list(col), type=field.type) for col, field in zip(columns, schema, strict=True)],
        schema=schema,
    )


def _rows(batch: Any) -> Iterator[Row]:
    return zip(*(col.to_pylist() for col in batch.columns), strict=True)


def _headers_out(headers: Headers | None) -> list[dict[str, Any]] | None:
    if not headers:
        return None
    return [{"key": k, "value": v} for k, v in headers]


def _headers_in(headers: list[dict[str, Any]] | None) -> Headers | None:
    if not headers:
        return None
    return [(h["key"], h["value"]) for h in headers]


class BackfillRecordError(BackfillError):
    """A record failed and its handler is log_and_fail: the backfill stops."""


class BackfillContext:
    """The `TaskContext` of a stage runner: collects rows, numbers them.

    `begin` sets the record being processed (topic, task partition, offset,
    timestamp, order, stream time); every row emitted while processing it gets
    `order + [n]`, n counting up from 0.
    """

    def __init__(self, plan: BackfillPlan, stage: StagePlan) -> None:
        self.plan = plan
        self.stage = stage
        self.out: list[Row] = []
        self.topic = ""
        self.partition = 0
        self.offset = -1
        self.order: list[int] = []
        self.record_timestamp = 0
        self.stream_time = -1
        self.dropped: Counter[str] = Counter()
        self._seq = 0
        self._round_robin = 0

    @property
    def task_id(self) -> str:
        return f"{self.stage.id}_{self.partition}"

    @property
    def application_id(self) -> str:
        return self.plan.application_id

    @property
    def default_key_serde(self) -> Any:
        return self.plan.default_key_serde

    @property
    def default_value_serde(self) -> Any:
        return self.plan.default_value_serde

    def begin(
        self,
        topic: str,
        partition: int,
        offset: int,
        timestamp: int,
        order: list[int],
        stream_time: int,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.record_timestamp = timestamp
        self.order = order
        self.stream_time = stream_time
        self._seq = 0

    def next_order(self) -> list[int]:
        order = [*self.order, self._seq]
        self._seq += 1
        return order

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Headers | None,
        partition: int | None,
    ) -> None:
        if partition is None:
            count = self.partition_count(topic)
            if key is not None:
                partition = default_partition(key, count)
            else:
                self._round_robin += 1
                partition = self._round_robin % count
        self.out.append(
            (
                KIND_RECORD,
                topic,
                partition,
                key,
                value,
                -1,
                timestamp,
                _headers_out(headers),
                self.next_order(),
                -1,
            )
        )

    def capture(
        self, agg: int, key: bytes | None, window_start: int, payload: bytes | None, timestamp: int
    ) -> None:
        self.out.append(
            (
                KIND_CAPTURE,
                None,
                self.partition,
                key,
                payload,
                window_start,
                timestamp,
                None,
                self.next_order(),
                agg,
            )
        )

    def partition_count(self, topic: str) -> int:
        try:
            return self.plan.partitions[topic]
        except KeyError:
            raise KeyError(f"topic {topic!r} is not an output topic of this topology") from None

    def resolve_topic(self, name: str, internal: bool) -> str:
        return f"{self.plan.application_id}-{name}" if internal else name

    def schedule(
        self, interval_ms: int, punctuation_type: PunctuationType, callback: Callable[[int], None]
    ) -> Any:
        raise BackfillError("backfill cannot run punctuations (Processor API)")

    def request_commit(self) -> None:
        pass

    def state_store(self, name: str) -> Any:
        raise BackfillError(f"backfill gives nodes no state store (asked for {name!r})")

    def register_flush_listener(self, store: str, listener: Any) -> None:
        raise BackfillError(f"backfill has no store {store!r} to listen to")

    def record_dropped(self, reason: str) -> None:
        self.dropped[reason] += 1


def missing_marker(fold: Callable[..., Any]) -> Any:
    """The "no aggregate yet" marker `fold` compares with.

    The DSL's folds are closures, shipped to the workers by value: the copy
    of `stateful_nodes.MISSING` they compare with (`agg is MISSING`) lands in
    their own globals, a different object from this module's. (A
    `_Missing.__reduce__` returning "MISSING" would keep it one object.)
    """
    marker = getattr(fold, "__globals__", {}).get("MISSING")
    return marker if type(marker).__name__ == "_Missing" else MISSING


class AggregateStandIn(Node):
    """Takes an aggregation node's place (see the module docstring)."""

    __slots__ = (
        "spec",
        "key_serde",
        "value_serde",
        "fold",
        "ctx",
        "key_ser",
        "key_de",
        "value_ser",
        "value_de",
        "_needs_value",
    )

    def __init__(self, d: NodeDef, spec: AggregateSpec) -> None:
        super().__init__(d.name)
        self.spec = spec
        self.key_serde = d.params["key_serde"]
        self.value_serde = d.params["value_serde"]
        self.fold = d.params["fold"]
        self.ctx: BackfillContext | None = None
        self._needs_value = not spec.is_count

    def init(self, ctx: Any) -> None:
        self.ctx = ctx
        key = resolve_serde(self.key_serde, ctx.default_key_serde, self.name, "key")
        value = resolve_serde(self.value_serde, ctx.default_value_serde, self.name, "value")
        self.key_ser, self.key_de = key.serialize, key.deserialize
        self.value_ser, self.value_de = value.serialize, value.deserialize

    # -- input pass --------------------------------------------------------------

    def process(self, record: Record) -> None:
        ctx = self.ctx
        assert ctx is not None
        key = record.key
        if key is None:
            ctx.record_dropped("null_key")
            return
        value = record.value
        if value is None:
            ctx.record_dropped("null_value")
            return
        key_bytes = self.key_ser(key)
        payload = (
            pickle.dumps((key, value), protocol=pickle.HIGHEST_PROTOCOL)
            if self._needs_value
            else None
        )
        windows = self.spec.windows
        if windows is None:
            ctx.capture(self.spec.index, key_bytes, -1, payload, record.timestamp)
            return
        timestamp = record.timestamp
        if timestamp < 0:
            ctx.record_dropped("negative_timestamp")
            return
        stream_time = max(ctx.stream_time, timestamp)
        close_time = stream_time - windows.grace_ms
        for start in windows.window_starts(timestamp):
            if start + windows.size_ms <= close_time:
                ctx.record_dropped("late")
                continue
            ctx.capture(self.spec.index, key_bytes, start, payload, timestamp)

    # -- fold pass ---------------------------------------------------------------

    def fold_values(self, payloads: Iterable[bytes]) -> bytes | None:
        """The serialized aggregate after folding `payloads` in order (None: deleted).

        As `AggregateNode`: each step's aggregate goes through the value serde
        (the store keeps bytes), so the next step sees what a daemon would.
        """
        old: bytes | None = None
        fold, ser, de = self.fold, self.value_ser, self.value_de
        missing = missing_marker(fold)
        for payload in payloads:
            key, value = pickle.loads(payload)
            agg = fold(key, value, missing if old is None else de(old))
            old = None if agg is None else ser(agg)
        return old

    # -- result pass -------------------------------------------------------------

    def emit_result(
        self, key: bytes, window_start: int, value: bytes | None, timestamp: int
    ) -> None:
        """Forward a final aggregate as the store's flush would."""
        key_obj = self.key_de(key)
        windows = self.spec.windows
        if windows is not None:
            key_obj = Windowed(key_obj, window_start, window_start + windows.size_ms)
        self._emit(Record(key_obj, None if value is None else self.value_de(value), timestamp))


class StageRunner:
    """One subtopology's nodes, wired and initialized over a `BackfillContext`."""

    def __init__(self, plan: BackfillPlan, stage_id: int) -> None:
        stage = plan.stage(stage_id)
        self.plan = plan
        self.stage = stage
        self.ctx = BackfillContext(plan, stage)
        specs = {a.node: a for a in stage.aggregates}
        nodes: dict[str, Node] = {}
        ordered: list[Node] = []
        for d in stage.defs:
            node: Node = AggregateStandIn(d, specs[d.name]) if d.name in specs else d.make()
            nodes[d.name] = node
            ordered.append(node)
        for d in stage.defs:
            for child in d.children:
                nodes[d.name].add_child(nodes[child])
        self.sources: dict[str, SourceNode] = {}
        for d in stage.defs:
            if d.kind is NodeKind.SOURCE:
                source = nodes[d.name]
                assert isinstance(source, SourceNode)
                for topic in d.topics:
                    self.sources[self.ctx.resolve_topic(topic, d.internal)] = source
        for node in ordered:
            node.init(self.ctx)
        self.aggregates: list[AggregateStandIn] = []
        for a in stage.aggregates:
            stand_in = nodes[a.node]
            assert isinstance(stand_in, AggregateStandIn)
            self.aggregates.append(stand_in)
        self.skipped = 0

    # -- one input record --------------------------------------------------------

    def process(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Headers | None,
        order: list[int],
        stream_time: int,
    ) -> None:
        ctx = self.ctx
        ctx.begin(
            topic,
            partition,
            offset,
            timestamp,
            order,
            stream_time if stream_time >= 0 else timestamp,
        )
        source = self.sources[topic]
        try:
            record = source.deserialize(key, value, timestamp, headers, topic, partition, offset)
        except Exception as exc:
            self._failed("deserialization", exc, key, value, timestamp, headers)
            return
        try:
            source.process(record)
        except BackfillError:
            raise
        except Exception as exc:
            self._failed("processing", exc, key, value, timestamp, headers)

    def _failed(
        self,
        stage: str,
        exc: Exception,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Headers | None,
    ) -> None:
        """As the task's handler: dead-letter the original bytes if configured, then
        skip (log_and_continue, dead_letter_queue) or stop the backfill (log_and_fail)."""
        plan, ctx = self.plan, self.ctx
        handler = (
            plan.deserialization_handler if stage == "deserialization" else plan.processing_handler
        )
        if plan.dead_letter_topic is not None:
            dlq_headers = dead_letter_headers(exc, stage, ctx.topic, ctx.partition, ctx.offset)
            ctx.send(
                plan.dead_letter_topic,
                key,
                value,
                timestamp,
                list(headers or []) + dlq_headers,
                None,
            )
        if handler in (LOG_AND_CONTINUE, DEAD_LETTER_QUEUE):
            self.skipped += 1
            ctx.record_dropped(f"{stage}_error")
            return
        raise BackfillRecordError(
            f"{stage} error at {ctx.topic}-{ctx.partition}@{ctx.offset} (stage {self.stage.id}): "
            f"{type(exc).__name__}: {exc}; {stage}.exception.handler is {handler} (set it to "
            "log_and_continue or dead_letter_queue to skip bad records)"
        ) from exc

    def take(self) -> list[Row]:
        out, self.ctx.out = self.ctx.out, []
        return out


# -- the three passes (generators for mapInArrow) -----------------------------------


def input_pass(plan: BackfillPlan, stage_id: int, batches: Iterable[Any]) -> Iterator[Any]:
    """Stage input rows -> records for topics, captured values and stream-time marks."""
    runner = StageRunner(plan, stage_id)
    schema = arrow_schema(OUTPUT_SCHEMA)
    stream_times: dict[int, int] = {}
    process = runner.process
    for batch in batches:
        for topic, partition, offset, key, value, timestamp, headers, order, stream_time in _rows(
            batch
        ):
            if timestamp > stream_times.get(partition, -1):
                stream_times[partition] = timestamp
            process(
                topic,
                partition,
                offset,
                key,
                value,
                timestamp,
                _headers_in(headers),
                order or [],
                -1 if stream_time is None else stream_time,
            )
        rows = runner.take()
        if rows:
            yield _to_batch(rows, schema)
    marks: list[Row] = [
        (KIND_STREAM_TIME, None, p, None, None, -1, ts, None, [], -1)
        for p, ts in stream_times.items()
    ]
    if marks:
        yield _to_batch(marks, schema)


def fold_pass(plan: BackfillPlan, stage_id: int, batches: Iterable[Any]) -> Iterator[Any]:
    """Captured values, sorted by (agg, partition, key, window_start, order) -> one
    RESULT row per group: the folded, serialized aggregate and the last timestamp."""
    runner = StageRunner(plan, stage_id)
    schema = arrow_schema(RESULT_SCHEMA)
    out: list[Row] = []
    current: tuple[int, int, bytes, int] | None = None
    payloads: list[bytes] = []
    last_ts = -1

    def flush() -> None:
        if current is None:
            return
        agg, partition, key, start = current
        value = runner.aggregates[agg].fold_values(payloads)
        out.append((agg, partition, key, start, value, None, last_ts))

    for batch in batches:
        for agg, partition, key, start, payload, timestamp in _rows(batch):
            group = (agg, partition, key, start)
            if group != current:
                flush()
                current, payloads = group, []
            payloads.append(payload)
            last_ts = timestamp
        if len(out) >= 10000:
            yield _to_batch(out, schema)
            out = []
    flush()
    if out:
        yield _to_batch(out, schema)


def result_pass(
    plan: BackfillPlan, stage_id: int, stream_times: Mapping[int, int], batches: Iterable[Any]
) -> Iterator[Any]:
    """Final aggregates -> changelog records and whatever the downstream nodes write.

    Window stores keep only windows within retention of the task's final
    stream time (`stream_times`): older ones a daemon would have expired, so
    they go downstream but not into the changelog.
    """
    runner = StageRunner(plan, stage_id)
    ctx = runner.ctx
    schema = arrow_schema(OUTPUT_SCHEMA)
    for batch in batches:
        for agg, partition, key, start, value, count, timestamp in _rows(batch):
            stand_in = runner.aggregates[agg]
            spec = stand_in.spec
            if count is not None:
                value = stand_in.value_ser(count)
            ctx.begin(spec.changelog or "", partition, -1, timestamp, [timestamp], timestamp)
            windows = spec.windows
            retained = (
                windows is None or start >= stream_times.get(partition, -1) - windows.retention_ms
            )
            if spec.changelog is not None and value is not None and retained:
                store_key = key if windows is None else key + start.to_bytes(8, "big")
                ctx.send(spec.changelog, store_key, value, timestamp, None, partition)
            try:
                stand_in.emit_result(key, start, value, timestamp)
            except BackfillError:
                raise
            except Exception as exc:
                if plan.processing_handler in (LOG_AND_CONTINUE, DEAD_LETTER_QUEUE):
                    ctx.record_dropped("processing_error")
                    continue
                raise BackfillRecordError(
                    f"processing error downstream of {spec.node!r} (stage {stage_id}, task "
                    f"partition {partition}): {type(exc).__name__}: {exc}"
                ) from exc
        rows = runner.take()
        if rows:
            yield _to_batch(rows, schema)
