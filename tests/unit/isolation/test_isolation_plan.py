"""What a process-isolated query's child runs with (runtime.isolation.plan),
and the config rules around `query.<name>.isolation`."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from runtime import App, StreamsBuilder, Topology, serdes
from runtime.config import ConfigError, StreamsConfig
from runtime.isolation.plan import ChildSpec, child_application_id, child_nice, child_spec


def config(**extra: Any) -> StreamsConfig:
    return StreamsConfig.from_dict(
        {
            "application.id": "shop",
            "bootstrap.servers": "localhost:9092",
            "admin.socket": "/tmp/shop.sock",
            "metrics.port": 9400,
            "processing.threads": 4,
            "query.light.priority": 10,
            "query.heavy.isolation": "process",
            **extra,
        }
    )


def copy(source: str, sink: str) -> Topology:
    builder = StreamsBuilder()
    builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING).to(sink)
    return builder.build()


def test_the_child_gets_its_own_identity_and_none_of_the_daemons_endpoints() -> None:
    spec = child_spec(config(), "heavy", "app:queries", {"light": 10, "heavy": 0})
    assert spec.config["application.id"] == child_application_id(config(), "heavy")
    assert spec.config["application.id"] == "shop-heavy"
    assert spec.parent_group == "shop"
    assert spec.config["client.id"].endswith("-heavy")
    for key in spec.config:
        assert not key.startswith(("query.", "admin.socket", "metrics."))
    # Without query.heavy.max.threads the child has the daemon's thread count.
    assert spec.config["processing.threads"] == 4
    assert ChildSpec.from_line(spec.to_line()) == spec
    paused = dataclasses.replace(spec, paused_all=True, paused_tasks=("0_1", "0_2"))
    assert ChildSpec.from_line(paused.to_line()) == paused


def test_max_threads_becomes_the_childs_thread_count() -> None:
    spec = child_spec(
        config(**{"query.heavy.max.threads": 1}), "heavy", "app:queries", {"heavy": 0}
    )
    assert spec.config["processing.threads"] == 1
    assert child_spec(config(), "heavy", "a:b", {}, max_threads=2).config["processing.threads"] == 2


@pytest.mark.parametrize(
    ("priorities", "given", "nice"),
    [
        ({"light": 10, "heavy": 0}, None, 19),  # below another query: yields the CPU
        ({"light": 0, "heavy": 0}, None, 0),
        ({"light": 0, "heavy": 5}, None, 0),
        ({"light": 10, "heavy": 0}, 7, 7),  # query.<name>.nice wins
    ],
)
def test_niceness_follows_priority_unless_given(
    priorities: dict[str, int], given: int | None, nice: int
) -> None:
    extra = {} if given is None else {"query.heavy.nice": given}
    assert child_nice(config(**extra), "heavy", priorities) == nice


def test_a_config_value_that_is_not_text_names_its_key() -> None:
    with pytest.raises(ConfigError) as caught:
        child_spec(config(**{"default.value.serde": serdes.STRING}), "heavy", "a:b", {})
    assert "default.value.serde" in str(caught.value)
    assert "module:attr" in str(caught.value)


def test_bad_isolation_and_nice_values_fail_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="query.heavy.isolation"):
        config(**{"query.heavy.isolation": "fork"})
    with pytest.raises(ConfigError, match="query.heavy.nice"):
        config(**{"query.heavy.nice": 20})


def test_an_isolated_query_needs_a_source_and_one_query_stays_in_the_daemon() -> None:
    queries = {"light": copy("a", "b"), "heavy": copy("c", "d")}
    with pytest.raises(ConfigError, match="source="):
        App(queries, config())
    app = App(queries, config(), source="app:queries")
    assert app.queries == ["light", "heavy"]
    # Only the daemon's own query is in its topology.
    assert {s.query for s in app.topology.subtopologies} == {"light"}
    with pytest.raises(KeyError, match="runs in a child process"):
        app.store("heavy.counts")
    with pytest.raises(ConfigError, match="at least one query"):
        App(queries, config(**{"query.light.isolation": "process"}), source="app:queries")
