"""Closing a consumer that never joined its group, without waiting for it.

librdkafka's consumer close (`Consumer.close()`, and the destruction of a
handle that was not closed) waits until the group protocol is done with the
member: with a JoinGroup in flight, until the coordinator answers it. The
coordinator answers when the rebalance completes, and a rebalance waits for
every member it knows of, including a pending one (KIP-394: a JoinGroup whose
answer, MEMBER_ID_REQUIRED, the client never saw, e.g. a request retried on a
loaded machine) until that one's session times out. Measured on a loaded
machine (2 cores, CPU hogs): a close during start-up usually took 0.1-0.6 s,
once more than 60 s, all of it inside the handle's destruction on the polling
thread, so `App.close(30)` returned False.

A member that was never assigned anything owns nothing: no offsets to commit,
no task to close. So its consumer is closed on a short-lived daemon thread
and the app's shutdown goes on at once; the broker forgets the member when
the close completes or its session times out. The polling thread hands the
consumer over and never touches it again.
"""

from __future__ import annotations

import threading
import time

from confluent_kafka import Consumer

from runtime.logging import get_logger

log = get_logger("runtime.polling")

# A close slower than this is logged when it ends (it no longer delays anyone).
_SLOW_CLOSE_S = 5.0


def close_in_background(consumer: Consumer, name: str) -> threading.Thread:
    """Close `consumer` on a daemon thread named `name` and return that thread
    (started). The caller must not use the consumer afterwards. Any thread."""
    thread = threading.Thread(target=_close, args=(consumer,), name=name, daemon=True)
    thread.start()
    return thread


def _close(consumer: Consumer) -> None:
    began = time.monotonic()
    try:
        consumer.close()
    except Exception as exc:
        log.warning("unjoined_consumer_close_failed", error=f"{type(exc).__name__}: {exc}")
        return
    took = time.monotonic() - began
    if took >= _SLOW_CLOSE_S:
        log.info(
            "unjoined_consumer_closed_late",
            took_s=round(took, 1),
            reason="the group coordinator answered the pending JoinGroup only now",
        )
