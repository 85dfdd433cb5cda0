"""Is the cluster reachable? Outages are ridden out and reported, not fatal.

The shared clients report trouble three ways: librdkafka's error callback (all
brokers down, transport errors, timeouts), a producer flush that stops making
progress (a stalled broker raises no client error until socket timeouts
expire), and a fatal client error (the producer fenced for good, an
authorization failure). The first two mark the broker unreachable (logged once,
shown in status and metrics) until records flow or a commit succeeds again;
the last stops the polling thread without committing.

Called by the polling thread only (client callbacks run inside its poll and
flush calls); `down_since` is read racily by status.

A coordinator call that keeps failing (a transaction's init, commit or abort;
a rewind's committed offsets) is retried on the polling thread for up to a
couple of minutes; `Retrying` says which call and since when, so that status
and `/metrics` show why the loop stands still (its own figures stop moving).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException

from runtime.logging import get_logger

log = get_logger("runtime.polling")

_OUTAGE_CODES = (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._TIMED_OUT)


class Retrying:
    """The call the polling thread is retrying now, if any. Written by the
    retry loops (polling thread), read racily by status: one attribute, so a
    reader never sees one call with another's start."""

    def __init__(self) -> None:
        self._now: tuple[str, float] | None = None  # (call, wall time of its first retry)

    @property
    def now(self) -> tuple[str, float] | None:
        """(call, wall time of its first retry), or None: one consistent read."""
        return self._now

    def note(self, call: str) -> None:
        """`call` failed and is tried again (the loop logs each retry itself)."""
        now = self._now
        if now is None or now[0] != call:
            self._now = (call, time.time())

    def clear(self) -> None:
        """The retry loop ended (the call succeeded or the loop gave up)."""
        self._now = None


class BrokerHealth:
    """Tracks outages of the cluster. Polling thread only."""

    def __init__(self, on_fatal: Callable[[KafkaException], None]) -> None:
        self._on_fatal = on_fatal
        self.down_since: float | None = None  # wall-clock time, None while reachable
        self.retrying = Retrying()

    def on_client_error(self, error: KafkaError) -> None:
        """librdkafka's error callback for the shared clients."""
        if error.code() in _OUTAGE_CODES:
            self._mark_down(error=error.str())
            return
        if error.fatal():
            log.error("client_fatal_error", error=error.str())
            self._on_fatal(KafkaException(error))
            return
        log.warning("client_error", error=error.str())

    def on_flush_stall(self, unacknowledged: int) -> None:
        """A producer flush made no progress for a while."""
        if self.down_since is None:
            self._mark_down(reason="flush stalled", unacknowledged=unacknowledged)
        else:
            log.warning("flush_waiting", unacknowledged=unacknowledged)

    def note_ok(self) -> None:
        """Records flowed or a commit succeeded: the broker is back."""
        if self.down_since is not None:
            log.info("broker_reachable_again", down_s=round(time.time() - self.down_since, 1))
            self.down_since = None

    def _mark_down(self, **facts: object) -> None:
        if self.down_since is None:
            self.down_since = time.time()
            log.warning("broker_unreachable", **facts)
