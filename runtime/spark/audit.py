"""`streams-runtime audit`: does an output topic hold what its input says it should?

A Spark job over both topics (read_committed by default, from the beginning
to the end as of the audit), for one of two relations:

- `identity`: every input record appears exactly once in the output. A
  record's identity is its key and value bytes (`id="record"`), its key, its
  value, or a field of its JSON value (`id_field`, the same field in both
  topics). Counted per identity: an input identity seen n times must be seen
  n times in the output. Less is *missing*, more is *duplicated*, an
  identity the input never had is *unexpected*.
- `counts`: the output is a table of counts per key (a word count, an event
  count): the latest value of each output key (8-byte big-endian INT64, or a
  decimal string) must equal the number of input records with that key (the
  input key, or a field of the JSON input value, `key_field`). A count that
  is short is *missing* records, one that is high *duplicated* records, an
  output key the input never had is *unexpected*.

Both topics are read with Spark's Kafka connector (`format("kafka")`, the
faster reader) unless `source="streams-kafka"` (or the session setting
`spark.streamsRuntime.kafkaSource`) selects the project's data source; see
`runtime.spark.sources`. The ranges are the ends learnt from the fetch path
when the audit starts, so both sources read the same records.

`run_audit` returns an `AuditReport` (`ok`, the three tallies, samples);
the CLI prints `render()` and exits 1 on a mismatch. Runs on the driver.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from runtime.spark import kafka as k
from runtime.spark.sources import read_ranges, session_source

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

RELATIONS = ("identity", "counts")
ID_MODES = ("record", "key", "value")
VALUE_FORMATS = ("int64", "string")
_NULL = "-"  # not in the base64 alphabet: a null key/value never equals a real one


@dataclass
class AuditReport:
    """The outcome of one audit; `ok` when nothing is missing, duplicated or unexpected."""

    relation: str
    identity: str
    input_topic: str
    output_topic: str
    isolation: str
    input_records: int
    output_records: int
    missing: int
    duplicated: int
    unexpected: int
    keys: int = 0
    samples: dict[str, list[str]] = field(default_factory=dict)
    source: str = "kafka"

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicated or self.unexpected)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def render(self) -> str:
        unit = "records"
        lines = [
            f"audit {self.relation} ({self.identity}): input {self.input_topic!r} "
            f"{self.input_records:,} records, output {self.output_topic!r} "
            f"{self.output_records:,} records ({self.isolation}, read with {self.source})"
        ]
        if self.relation == "counts":
            lines.append(f"  keys        {self.keys:,}")
        for name, value, what in (
            ("missing", self.missing, unit),
            ("duplicated", self.duplicated, unit),
            ("unexpected", self.unexpected, "records" if self.relation == "identity" else "keys"),
        ):
            lines.append(f"  {name:<11} {value:,} {what}")
            for sample in self.samples.get(name, []):
                lines.append(f"      {sample}")
        lines.append(f"result: {'OK' if self.ok else 'MISMATCH'}")
        return "\n".join(lines)


def _read(
    spark: SparkSession,
    source: str,
    bootstrap: str,
    topic: str,
    marks: Mapping[k.TopicPartitionKey, tuple[int, int]],
    isolation: str,
    overrides: Mapping[str, str] | None,
) -> DataFrame:
    mine = {tp: m for tp, m in marks.items() if tp[0] == topic}
    starts = {tp: lo for tp, (lo, _) in mine.items()}
    ends = {tp: hi for tp, (_, hi) in mine.items()}
    return read_ranges(spark, source, bootstrap, [topic], starts, ends, isolation, overrides)


def _b64(column: str) -> Column:
    from pyspark.sql import functions as F

    return F.coalesce(F.base64(F.col(column)), F.lit(_NULL))


def _identity(mode: str, id_field: str | None) -> Column:
    from pyspark.sql import functions as F

    if id_field is not None:
        return F.coalesce(
            F.get_json_object(F.col("value").cast("string"), f"$.{id_field}"), F.lit(_NULL)
        )
    if mode == "key":
        return _b64("key")
    if mode == "value":
        return _b64("value")
    return F.concat(_b64("key"), F.lit("|"), _b64("value"))


def _show_bytes(text: str) -> str:
    if text == _NULL:
        return "null"
    raw = base64.b64decode(text)
    shown = repr(raw[:60])
    return shown + ("..." if len(raw) > 60 else "")


def _show_id(identity: str, mode: str, id_field: str | None) -> str:
    if id_field is not None:
        return f"{id_field}={identity}"
    if mode == "record":
        key, _, value = identity.partition("|")
        return f"key={_show_bytes(key)} value={_show_bytes(value)}"
    return f"{mode}={_show_bytes(identity)}"


def audit_identity(
    inp: DataFrame, out: DataFrame, mode: str, id_field: str | None, samples: int
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    ident = _identity(mode, id_field)
    a = inp.select(ident.alias("id")).groupBy("id").agg(F.count("*").alias("n_in"))
    b = out.select(ident.alias("id")).groupBy("id").agg(F.count("*").alias("n_out"))
    joined = a.join(b, "id", "full_outer").fillna(0, ["n_in", "n_out"]).cache()
    try:
        totals = joined.agg(
            F.sum("n_in").alias("input"),
            F.sum("n_out").alias("output"),
            F.sum(F.when(F.col("n_out") < F.col("n_in"), F.col("n_in") - F.col("n_out"))).alias(
                "missing"
            ),
            F.sum(
                F.when(
                    (F.col("n_in") > 0) & (F.col("n_out") > F.col("n_in")),
                    F.col("n_out") - F.col("n_in"),
                )
            ).alias("duplicated"),
            F.sum(F.when(F.col("n_in") == 0, F.col("n_out"))).alias("unexpected"),
        ).collect()[0]
        found: dict[str, list[str]] = {}
        conditions = {
            "missing": F.col("n_out") < F.col("n_in"),
            "duplicated": (F.col("n_in") > 0) & (F.col("n_out") > F.col("n_in")),
            "unexpected": F.col("n_in") == 0,
        }
        for name, condition in conditions.items():
            if not totals[name]:
                continue
            rows = joined.filter(condition).orderBy("id").limit(samples).collect()
            found[name] = [
                f"{_show_id(r['id'], mode, id_field)}: {r['n_out']} in output, {r['n_in']} in input"
                for r in rows
            ]
    finally:
        joined.unpersist()
    return {
        "input_records": int(totals["input"] or 0),
        "output_records": int(totals["output"] or 0),
        "missing": int(totals["missing"] or 0),
        "duplicated": int(totals["duplicated"] or 0),
        "unexpected": int(totals["unexpected"] or 0),
        "samples": found,
    }


def audit_counts(
    inp: DataFrame, out: DataFrame, key_field: str | None, value_format: str, samples: int
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    if key_field is not None:
        in_key = F.get_json_object(F.col("value").cast("string"), f"$.{key_field}")
    else:
        in_key = F.col("key").cast("string")
    expected = (
        inp.select(in_key.alias("k"))
        .filter(F.col("k").isNotNull())
        .groupBy("k")
        .agg(F.count("*").alias("expected"))
    )
    # Latest value per key: highest offset within a partition; if a key sits in
    # several partitions, the partition whose latest record is newest.
    per_partition = (
        out.filter(F.col("key").isNotNull())
        .groupBy(F.col("key").cast("string").alias("k"), "partition")
        .agg(
            F.max_by("value", "offset").alias("v"),
            F.max("timestamp").alias("ts"),
        )
    )
    latest = per_partition.groupBy("k").agg(F.max_by("v", "ts").alias("v"))
    if value_format == "int64":
        parsed = F.when(F.length("v") == 8, F.conv(F.hex("v"), 16, 10).cast("long"))
    else:
        parsed = F.col("v").cast("string").cast("long")
    actual = latest.select("k", parsed.alias("actual"))
    joined = expected.join(actual, "k", "full_outer").cache()
    try:
        e, a = F.coalesce(F.col("expected"), F.lit(0)), F.coalesce(F.col("actual"), F.lit(0))
        conditions = {
            "missing": F.col("expected").isNotNull() & (a < e),
            "duplicated": F.col("expected").isNotNull() & (a > e),
            "unexpected": F.col("expected").isNull(),
        }
        totals = joined.agg(
            F.sum(e).alias("input"),
            F.count(F.col("expected")).alias("keys"),
            F.sum(F.when(conditions["missing"], e - a)).alias("missing"),
            F.sum(F.when(conditions["duplicated"], a - e)).alias("duplicated"),
            F.sum(F.when(conditions["unexpected"], 1)).alias("unexpected"),
        ).collect()[0]
        found: dict[str, list[str]] = {}
        for name, condition in conditions.items():
            if not totals[name]:
                continue
            rows = joined.filter(condition).orderBy("k").limit(samples).collect()
            found[name] = [
                f"key={r['k']!r}: count {r['actual']} in output, {r['expected'] or 0} input records"
                for r in rows
            ]
    finally:
        joined.unpersist()
    return {
        "input_records": int(totals["input"] or 0),
        "output_records": out.count(),
        "keys": int(totals["keys"] or 0),
        "missing": int(totals["missing"] or 0),
        "duplicated": int(totals["duplicated"] or 0),
        "unexpected": int(totals["unexpected"] or 0),
        "samples": found,
    }


def run_audit(
    spark: SparkSession,
    bootstrap: str,
    input_topic: str,
    output_topic: str,
    relation: str = "identity",
    id_mode: str = "record",
    id_field: str | None = None,
    key_field: str | None = None,
    value_format: str = "int64",
    isolation: str = "read_committed",
    samples: int = 10,
    overrides: Mapping[str, str] | None = None,
    source: str | None = None,
) -> AuditReport:
    """Audit `output_topic` against `input_topic`; see the module docstring.

    `source`: `kafka` or `streams-kafka` (None: the session's setting, else `kafka`).
    Raises ValueError for bad arguments, `KafkaSourceError` for missing topics and
    `ConnectorUnavailable` when the `kafka` source is not on the session's classpath.
    """
    source = session_source(spark, source)
    if relation not in RELATIONS:
        raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}")
    if id_mode not in ID_MODES:
        raise ValueError(f"id must be one of {ID_MODES}, got {id_mode!r}")
    if value_format not in VALUE_FORMATS:
        raise ValueError(f"value format must be one of {VALUE_FORMATS}, got {value_format!r}")
    # On the driver: a readable error if a topic is missing, and the ends both sources read to.
    marks = k.watermarks(bootstrap, [input_topic, output_topic], isolation, overrides, timeout=30)
    inp = _read(spark, source, bootstrap, input_topic, marks, isolation, overrides)
    out = _read(spark, source, bootstrap, output_topic, marks, isolation, overrides)
    if relation == "identity":
        figures = audit_identity(inp, out, id_mode, id_field, samples)
        identity = f"id field {id_field}" if id_field else f"id {id_mode}"
    else:
        figures = audit_counts(inp, out, key_field, value_format, samples)
        identity = f"key field {key_field}" if key_field else "input key"
        identity += f", {value_format} counts"
    return AuditReport(
        source=source,
        relation=relation,
        identity=identity,
        input_topic=input_topic,
        output_topic=output_topic,
        isolation=isolation,
        **figures,
    )


def report_json(report: AuditReport) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=True)
