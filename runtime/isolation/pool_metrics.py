"""`/metrics` of a daemon with `processes` > 1: its processes' expositions merged.

The supervisor owns the one metrics endpoint; it has no app of its own.
Each scrape asks every running processing process for its exposition (the
`metrics` request over its pipe, runtime.isolation.child), parses it, adds
`process="p<i>"` to every sample and merges families of the same name, so
`sum by (...)` over the processes gives the daemon's figure. Its own
families: `streams_processes` (the wanted count), `streams_process_up`
(1 for a running process, with its pid) and
`streams_process_restarts_total` (restarts of each slot after a death);
and its own `process_*` (CPU, memory) under `process="supervisor"`.

Threads: `collect` runs on the metrics server's executor thread, one scrape
at a time (runtime.metrics.server).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from runtime.isolation.workers import WorkerPool

SUPERVISOR = "supervisor"


def relabel(families: Iterable[Metric], process: str, into: dict[str, Metric]) -> None:
    """Add `families`' samples to `into` (name -> merged family), each with
    `process=<process>`."""
    for family in families:
        merged = into.get(family.name)
        if merged is None:
            merged = into[family.name] = Metric(
                family.name, family.documentation, family.type, family.unit
            )
        for sample in family.samples:
            merged.samples.append(sample._replace(labels={**sample.labels, "process": process}))


class PoolCollector(Collector):
    """The merged families of a `WorkerPool` (see the module doc)."""

    def __init__(self, pool: WorkerPool) -> None:
        self._pool = pool
        self._own = ProcessCollector(registry=None)

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        pool = self._pool
        merged: dict[str, Metric] = {}
        for process, text in sorted(pool.expositions().items()):
            relabel(text_string_to_metric_families(text), process, merged)
        relabel(self._own.collect(), SUPERVISOR, merged)
        yield from merged.values()
        yield GaugeMetricFamily(
            "streams_processes", "Processing processes the daemon runs (wanted)", pool.processes
        )
        up = GaugeMetricFamily(
            "streams_process_up",
            "1 while the processing process runs, 0 while it is dead or restarting",
            labels=["process", "pid"],
        )
        restarts = CounterMetricFamily(
            "streams_process_restarts",
            "Restarts of a processing process's slot after its process died",
            labels=["process"],
        )
        for row in pool.process_rows():
            up.add_metric([row.name, str(row.pid or "")], 1.0 if row.up else 0.0)
            restarts.add_metric([row.name], row.restarts)
        yield up
        yield restarts


def pool_registry(pool: WorkerPool) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PoolCollector(pool))
    return registry
