"""Issue 20, serde mistakes: the error names the sink or repartition topic, the
node, the serde in force and the fix; the start-up dry run finds it on a sample
without running side effects; a query on a failed app says the app failed."""

from __future__ import annotations

from typing import Any

import pytest

from runtime import SerializationError, StreamsBuilder, Topology, serdes
from runtime.processing.store_queries import StoreQuery, StoreUnavailableError
from runtime.processing.task_manager import TaskManager
from runtime.topology.dry_run import Sample, dry_run
from runtime.topology.record import Record
from runtime.topology.testing import RecordingTaskContext


def _first_error(topology: Topology, topic: str, record: Record, **ctx: Any) -> SerializationError:
    graph = topology.subtopologies[0].instantiate()
    graph.init(RecordingTaskContext(**ctx))
    with pytest.raises(SerializationError) as info:
        graph.sources[topic].process(record)
    message = str(info.value)
    assert "\n" not in message
    return info.value


def test_dict_to_a_default_bytes_sink_names_sink_serde_and_fix() -> None:
    builder = StreamsBuilder()
    builder.stream("m-in", value_serde=serdes.STRING).map_values(lambda v: {"x": v}).to("m-out")
    error = _first_error(builder.build(), "m-in", Record(b"k", "v", 5))
    assert str(error) == (
        "sink 'KSTREAM-SINK-0000000002' writing topic 'm-out': value serde serdes.BYTES "
        "(default.value.serde) cannot serialize a dict (TypeError: BYTES serde expects bytes, "
        "got dict); fix: .to('m-out', value_serde=serdes.JSON), or --set default.value.serde=json"
    )
    assert (error.topic, error.node, error.part) == ("m-out", "KSTREAM-SINK-0000000002", "value")
    assert error.certain and isinstance(error.cause, TypeError)


def test_group_by_without_key_serde_points_at_the_repartition_topic() -> None:
    builder = StreamsBuilder()
    (
        builder.stream("w-in", key_serde=serdes.STRING, value_serde=serdes.STRING)
        .group_by(lambda key, word: word)
        .count(store="counts")
    )
    error = _first_error(builder.build(), "w-in", Record("k", "kafka", 5), application_id="wc")
    message = str(error)
    assert message.startswith(
        "repartition topic 'wc-counts-repartition' (node 'counts-repartition-sink'): "
        "key serde serdes.BYTES (default.key.serde) cannot serialize a str"
    )
    assert message.endswith(
        "fix: pass key_serde=serdes.STRING to the group_by()/group_by_key() that feeds this "
        "aggregation, or --set default.key.serde=string"
    )


def test_a_given_serde_and_through_and_repartition_name_their_call() -> None:
    builder = StreamsBuilder()
    builder.stream("t-in", value_serde=serdes.STRING).map_values(len).through(
        "t-mid", value_serde=serdes.STRING
    ).to("t-out")
    message = str(_first_error(builder.build(), "t-in", Record(b"k", "four", 5)))
    assert "value serde serdes.STRING (given in the topology) cannot serialize an int" in message
    assert "fix: .through('t-mid', value_serde=serdes.INT64)" in message

    builder = StreamsBuilder()
    builder.stream("r-in").map(lambda k, v: ("new-key", v)).repartition(name="by-key")
    message = str(_first_error(builder.build(), "r-in", Record(b"k", b"v", 5)))
    assert "repartition topic 'app-by-key-repartition'" in message
    assert "the repartition()/join() that makes this topic" in message


def test_a_value_no_builtin_serde_takes_says_to_convert_it() -> None:
    builder = StreamsBuilder()
    builder.stream("s-in").map_values(lambda v: {1, 2}).to("s-out", value_serde=serdes.JSON)
    error = _first_error(builder.build(), "s-in", Record(b"k", b"v", 5))
    assert "value serde serdes.JSON (given in the topology) cannot serialize a set" in str(error)
    assert "fix: turn the value into str, int, bytes or JSON data before this sink" in str(error)


def _sample(topic: str, value: bytes, key: bytes | None = b"k") -> Sample:
    return Sample(topic, 0, 7, key, value, 1_700_000_000_000)


def _dry(topology: Topology, *samples: Sample) -> SerializationError | None:
    return dry_run(topology.subtopologies[0], samples, "app", serdes.BYTES, serdes.BYTES, {})


def test_dry_run_finds_the_mistake_on_a_sample() -> None:
    builder = StreamsBuilder()
    builder.stream("m-in", value_serde=serdes.STRING).map_values(lambda v: {"x": v}).to("m-out")
    error = _dry(builder.build(), _sample("m-in", b"hello"))
    assert error is not None and error.certain and error.topic == "m-out"

    fixed = StreamsBuilder()
    fixed.stream("m-in", value_serde=serdes.STRING).map_values(lambda v: {"x": v}).to(
        "m-out", value_serde=serdes.JSON
    )
    assert _dry(fixed.build(), _sample("m-in", b"hello")) is None


def test_dry_run_runs_no_side_effect_and_skips_what_fails_for_other_reasons() -> None:
    seen: list[Any] = []
    builder = StreamsBuilder()
    stream = builder.stream("p-in", value_serde=serdes.STRING)
    stream.peek(lambda k, v: seen.append(v)).map_values(lambda v: {"x": v}).to("p-out")
    stream.foreach(lambda k, v: seen.append(v))
    assert _dry(builder.build(), _sample("p-in", b"x")) is None
    assert seen == []  # the peek stopped the record; foreach never ran

    failing = StreamsBuilder()
    failing.stream("f-in", value_serde=serdes.JSON).map_values(lambda v: {"x": v["missing"]}).to(
        "f-out"
    )
    assert _dry(failing.build(), _sample("f-in", b"{}"), _sample("f-in", b"not json")) is None


def test_dry_run_keeps_branch_routing() -> None:
    """A record whose branch leads to a side effect stops there; it does not
    fall through to the next branch's sink."""
    alerts: list[Any] = []
    builder = StreamsBuilder()
    branches = (
        builder.stream("b-in", value_serde=serdes.STRING)
        .map_values(lambda v: {"v": v})
        .split(name="b-")
        .branch(lambda k, v: v["v"] == "big", name="big")
        .default_branch(name="rest")
    )
    branches["b-big"].foreach(lambda k, v: alerts.append(v))
    branches["b-rest"].to("b-out")  # BYTES by default: a mistake for the rest
    topology = builder.build()
    assert _dry(topology, _sample("b-in", b"big")) is None
    assert alerts == []
    error = _dry(topology, _sample("b-in", b"small"))
    assert error is not None and error.topic == "b-out"


def test_a_query_on_a_failed_app_says_it_failed() -> None:
    def failed() -> None:
        raise StoreUnavailableError("store 'counts' cannot be queried: application 'a' failed")

    query = StoreQuery("counts", TaskManager(), serdes.STRING, serdes.INT64, False, 1.0, failed)
    for read in (lambda: query.get("kafka"), lambda: list(query.all())):
        with pytest.raises(StoreUnavailableError, match="application 'a' failed"):
            read()


def test_a_key_the_store_serde_refuses_names_the_store_and_serde() -> None:
    query = StoreQuery(
        "counts", TaskManager(), serdes.BYTES, serdes.INT64, False, key_serde_source="x.y"
    )
    with pytest.raises(TypeError) as info:
        query.get("kafka")
    assert str(info.value).startswith(
        "store 'counts': its key serde serdes.BYTES (x.y) cannot serialize the str 'kafka'"
    )
