"""Named queries without a broker: composing topologies, config keys, query
pausing in the task manager, the admin protocol's query commands."""

from __future__ import annotations

import pytest

from runtime import App, StreamsBuilder, serdes
from runtime.admin.protocol import ProtocolError, parse_request
from runtime.config import ConfigError, StreamsConfig, config_table_markdown
from runtime.partitioning.expansion_plan import changelog_topics
from runtime.processing.query_shares import QueryShare
from runtime.processing.task_manager import TaskManager
from runtime.status import AppStatus, QueryStatus
from runtime.topology.named_queries import QueryError, compose, with_query, without_query
from runtime.topology.topology import Topology
from tests.fakes.tasks import FakeTask

BASE = {"application.id": "app", "bootstrap.servers": "127.0.0.1:9092"}


def counting(source: str, out: str) -> Topology:
    """source -> repartition by value -> count (a changelogged store) -> out."""
    builder = StreamsBuilder()
    (
        builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING)
        .group_by(lambda k, v: v, key_serde=serdes.STRING)
        .count(store="counts")
        .to_stream()
        .to(out, value_serde=serdes.INT64)
    )
    return builder.build()


def plain(source: str, out: str) -> Topology:
    builder = StreamsBuilder()
    builder.stream(source).to(out)
    return builder.build()


def test_each_query_has_its_own_task_ids_internal_topics_and_changelogs() -> None:
    composite = compose({"orders": counting("in-a", "out-a"), "audit": counting("in-b", "out-b")})
    subs = composite.subtopologies
    assert [s.id for s in subs] == [0, 1, 2, 3]
    assert [s.query for s in subs] == ["orders", "orders", "audit", "audit"]
    assert [s.task_name for s in subs] == ["orders__0", "orders__1", "audit__0", "audit__1"]
    internal = {t.name for t in composite.internal_topics()}
    assert len(internal) == 2
    assert all(t.startswith(("orders-", "audit-")) for t in internal)
    assert changelog_topics("app", subs[1]) == ["app-orders-counts-changelog"]
    assert changelog_topics("app", subs[3]) == ["app-audit-counts-changelog"]
    # The plain topology keeps its names.
    single = counting("in-a", "out-a")
    assert single.subtopologies[0].task_name == "0"
    assert changelog_topics("app", single.subtopologies[1]) == ["app-counts-changelog"]


def test_a_composed_query_still_runs_its_graph() -> None:
    composite = compose({"q": plain("in", "out")})
    (sub,) = composite.subtopologies
    graph = sub.instantiate()
    assert list(graph.sources) == ["in"]


def test_two_queries_reading_one_topic_are_refused_with_what_to_do() -> None:
    with pytest.raises(QueryError, match=r"'in' \(read by query 'a'\).*own application.id"):
        compose({"a": plain("in", "x"), "b": plain("in", "y")})


@pytest.mark.parametrize("name", ["", "a.b", "x__y", "a b", "é", "q" * 65])
def test_bad_query_names_are_refused(name: str) -> None:
    with pytest.raises(QueryError, match="query name"):
        compose({name: plain("in", "out")})


def test_adding_and_removing_keeps_the_ids_of_the_others() -> None:
    composite = compose({"a": counting("in-a", "out-a"), "b": plain("in-b", "out-b")})
    without_a = without_query(composite, "a")
    assert [(s.id, s.task_name) for s in without_a.subtopologies] == [(2, "b__0")]
    again = with_query(without_a, "a", counting("in-a", "out-a"))
    assert [(s.id, s.task_name) for s in again.subtopologies] == [
        (2, "b__0"),
        (3, "a__0"),
        (4, "a__1"),
    ]
    with pytest.raises(QueryError, match="already runs"):
        with_query(again, "b", plain("in-c", "out-c"))
    with pytest.raises(QueryError, match="reads 'in-b'"):
        with_query(again, "c", plain("in-b", "out-c"))
    with pytest.raises(QueryError, match="no query 'zz'"):
        without_query(again, "zz")


def test_query_keys_are_parsed_and_validated_naming_the_key() -> None:
    config = StreamsConfig.from_dict(
        {**BASE, "query.hot.priority": "5", "query.hot.weight": 3, "query.hot.max.threads": 2}
    )
    assert config.query_settings == {"hot": {"priority": 5, "weight": 3, "max.threads": 2}}
    assert config.as_display_dict()["query.hot.weight"] == 3
    with pytest.raises(ConfigError, match=r"query.hot.weight.*between 1 and 10000"):
        StreamsConfig.from_dict({**BASE, "query.hot.weight": 0})
    with pytest.raises(ConfigError, match=r"query.hot.prio.*did you mean 'priority'"):
        StreamsConfig.from_dict({**BASE, "query.hot.prio": 1})
    with pytest.raises(ConfigError, match=r"query.priority.*query.<name>.<setting>"):
        StreamsConfig.from_dict({**BASE, "query.priority": 1})
    assert "`query.<name>.weight`" in config_table_markdown()


def test_query_keys_must_name_a_query_of_the_app() -> None:
    topology = plain("in", "out")
    with pytest.raises(ConfigError, match=r"query.hto.priority.*no query named 'hto'"):
        App({"hot": topology}, {**BASE, "query.hto.priority": 1})
    with pytest.raises(ConfigError, match=r"query.hot.priority.*need named queries"):
        App(topology, {**BASE, "query.hot.priority": 1})
    app = App({"hot": topology}, {**BASE, "query.hot.priority": 1})
    assert app.queries == ["hot"]
    assert app.status().queries[0].priority == 1


def test_named_queries_under_runtime_placement_are_refused_naming_the_key() -> None:
    # The placer reads task ids as <subtopology>_<partition>; a query's ids carry its name.
    with pytest.raises(ConfigError, match=r"task.assignment.*named queries.*=group"):
        App({"hot": plain("in", "out")}, {**BASE, "task.assignment": "runtime"})
    assert App(plain("in", "out"), {**BASE, "task.assignment": "runtime"}).queries == []


def test_a_paused_query_is_not_scheduled_and_resumes() -> None:
    a, b = FakeTask("a__0_0"), FakeTask("b__0_0")
    a.query, b.query = "a", "b"  # type: ignore[attr-defined]
    for task in (a, b):
        task.add(0)
    manager = TaskManager(shares={"a": QueryShare(priority=1)})
    manager.add_task(a)  # type: ignore[arg-type]
    manager.add_task(b)  # type: ignore[arg-type]
    manager.pause_query("a")
    assert manager.acquire_next("t1", 0.0, lambda: False) is b
    assert manager.acquire_next("t2", 0.0, lambda: False) is None
    manager.resume_query("a")
    assert manager.acquire_next("t2", 0.0, lambda: False) is a


def test_status_round_trips_queries() -> None:
    status = AppStatus(
        application_id="app",
        client_id="app",
        instance_id="i",
        state="RUNNING",
        started_at=None,
        processing_guarantee="at_least_once",
        assignment_strategy=None,
        threads=(),
        tasks=(),
        queries=(QueryStatus(name="q", state="FAILED", failure="boom", p99_latency_ms=3.0),),
    )
    again = AppStatus.from_dict(status.to_dict())
    assert again.queries == status.queries
    assert status["queries"][0]["failure"] == "boom"


def test_admin_query_commands_are_validated() -> None:
    request = parse_request('{"command": "query.add", "target": "apps.x:topology", "name": "q"}')
    assert request.args == {"target": "apps.x:topology", "name": "q"}
    assert parse_request('{"command": "query.remove", "name": "q", "reset": true}').args == {
        "name": "q",
        "reset": True,
    }
    assert parse_request('{"command": "pause", "task": "q__0_1"}').args == {"task": "q__0_1"}
    with pytest.raises(ProtocolError, match="needs the argument 'name'"):
        parse_request('{"command": "query.pause"}')
    with pytest.raises(ProtocolError, match="MODULE:ATTR"):
        parse_request('{"command": "query.add", "target": "x", "name": "q"}')
    with pytest.raises(ProtocolError, match="'weight' must be an integer from 1"):
        parse_request('{"command": "query.add", "target": "a:b", "name": "q", "weight": 0}')


def test_a_store_name_two_queries_use_must_be_qualified() -> None:
    app = App({"orders": counting("in-a", "out-a"), "audit": counting("in-b", "out-b")}, BASE)
    with pytest.raises(KeyError, match=r"used by queries \['audit', 'orders'\].*audit.counts"):
        app.store("counts")
    query = app.store("orders.counts")
    assert query.name == "counts"
