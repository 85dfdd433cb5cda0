"""Prometheus metrics and health endpoints, read from `App.status()` at scrape time.

- `families`: what is exported: `FAMILIES` (name, type, help), `METRIC_NAMES`,
  `AppCollector` (one status snapshot per scrape turned into metric families)
  and `make_registry`. Nothing on a hot path: the threads keep plain counters.
- `server`: the HTTP endpoint (`/metrics`, `/healthz`, `/readyz`) on an
  asyncio loop, with its connection cap and timeouts (`MetricsLimits`), and
  `start_metrics_server` for embedded apps (a background thread).

Threads: `AppCollector.collect` runs on whichever thread scrapes (an executor
thread of the admin loop). `MetricsServer` belongs to the loop it was started on.
"""

from runtime.metrics.families import (
    APP_STATES,
    FAMILIES,
    METRIC_NAMES,
    AppCollector,
    make_registry,
)
from runtime.metrics.server import (
    CONTENT_TYPE,
    BackgroundMetricsServer,
    MetricsLimits,
    MetricsServer,
    start_metrics_server,
)

__all__ = [
    "APP_STATES",
    "CONTENT_TYPE",
    "FAMILIES",
    "METRIC_NAMES",
    "AppCollector",
    "BackgroundMetricsServer",
    "MetricsLimits",
    "MetricsServer",
    "make_registry",
    "start_metrics_server",
]
