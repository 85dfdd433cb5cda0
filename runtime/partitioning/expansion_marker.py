"""Once per expansion: who runs `on_partition_expansion`, and what "once" means.

Why: the callback is the user's hook for work that belongs to an expansion
as a whole (a placement table, a notice, a downstream resize). Every
instance follows an expansion, so without an election it would run once per
instance; with an election alone (the old behaviour) an instance that
stopped between winning and finishing lost the call for good: at most once.

Now, effectively once with an idempotent callback:

1. Election: the instance whose CreateTopics of the marker topic
   `<application.id>-expansion-<old>to<new>[_<old>to<new>...]-<digest>`
   succeeds runs the callback (the broker lets exactly one create a name);
   the counts are in the name so that another instance can run it again
   without having seen the expansion.
2. Done: after every `(old, new)` call returned, that instance creates
   `<marker>-done`. A callback that raised is not done.
3. Recovery: `finish_interrupted_callbacks`, at every instance's start-up,
   looks for markers without their `-done` topic. It waits
   `grace_s` for a runner that is merely slow, then runs the callback itself
   and creates `-done`.

So the callback runs at least once per expansion (as long as some instance
of the app starts again after a crash), and more than once only when its
runner stopped (or raised) before `-done` was created, or ran longer than
`grace_s` while another instance started: it must be idempotent. Two empty
one-partition topics stay per expansion.

Threads: `marker_topic`, `done_topic`, `parse_marker` are pure;
`finish_interrupted_callbacks` runs on the caller of `App.start`, before any
thread of the app; the polling thread creates `-done` (`mark_done`).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from runtime.logging import get_logger

__all__ = [
    "done_topic",
    "finish_interrupted_callbacks",
    "mark_done",
    "marker_topic",
    "parse_marker",
    "run_callback",
]

log = get_logger("runtime.expansion")

_DONE = "-done"
_TIMEOUT_S = 30.0
_PAIRS = re.compile(r"(\d+)to(\d+)")


def marker_topic(application_id: str, changes: list[tuple[str, int, int]]) -> str:
    """The once-only marker of one expansion: the same name on every instance."""
    text = ";".join(f"{t}:{old}:{new}" for t, old, new in sorted(changes))
    pairs = "_".join(f"{old}to{new}" for old, new in sorted({(o, n) for _, o, n in changes}))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"{application_id}-expansion-{pairs}-{digest}"


def done_topic(marker: str) -> str:
    return marker + _DONE


def parse_marker(application_id: str, name: str) -> list[tuple[int, int]] | None:
    """The `(old, new)` pairs a marker topic of this app names, or None."""
    prefix = f"{application_id}-expansion-"
    if not name.startswith(prefix) or name.endswith(_DONE):
        return None
    pairs, sep, digest = name[len(prefix) :].rpartition("-")
    if not sep or not re.fullmatch(r"[0-9a-f]{16}", digest):
        return None
    parts = pairs.split("_")
    found = [_PAIRS.fullmatch(p) for p in parts]
    if not all(found):
        return None
    return [(int(m.group(1)), int(m.group(2))) for m in found if m is not None]


def run_callback(hook: Callable[[int, int], Any], pairs: list[tuple[int, int]]) -> bool:
    """Call `hook(old, new)` for each pair; True if every call returned."""
    ok = True
    for old, new in sorted(set(pairs)):
        try:
            hook(old, new)
            log.info("partition_expansion_callback", old_count=old, new_count=new)
        except Exception as exc:  # the user's code: reported, the expansion goes on
            ok = False
            log.error(
                "partition_expansion_callback_failed",
                old_count=old,
                new_count=new,
                error=f"{type(exc).__name__}: {exc}",
                retried="at the next start-up of an instance",
            )
    return ok


def mark_done(
    admin: AdminClient, marker: str, replication_factor: int, wait_s: float = 0.0
) -> None:
    """Create `<marker>-done`; the outcome is logged. Waits up to `wait_s`
    (0: not at all, for the polling thread, whose admin client lives on)."""
    name = done_topic(marker)
    try:
        future = admin.create_topics(
            [NewTopic(name, 1, replication_factor)],
            operation_timeout=_TIMEOUT_S,
            request_timeout=_TIMEOUT_S,
        )[name]
    except KafkaException as exc:
        log.error("partition_expansion_done_not_recorded", topic=name, error=str(exc))
        return

    def report(done: Any) -> None:
        try:
            done.result()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                log.error("partition_expansion_done_not_recorded", topic=name, error=str(exc))

    future.add_done_callback(report)
    if wait_s > 0:
        with contextlib.suppress(Exception):  # reported by `report`
            future.result(wait_s)


def _unfinished(admin: AdminClient, application_id: str) -> dict[str, list[tuple[int, int]]]:
    names = set(admin.list_topics(timeout=_TIMEOUT_S).topics)
    return {
        name: pairs
        for name in names
        if (pairs := parse_marker(application_id, name)) is not None
        and done_topic(name) not in names
    }


def finish_interrupted_callbacks(
    admin: AdminClient,
    application_id: str,
    partitioner: Any,
    replication_factor: int,
    grace_s: float = 10.0,
) -> int:
    """Run the callback of expansions whose runner did not record it done;
    how many. Waits up to `grace_s` first (a slow runner finishes). The
    caller of `App.start`; a failing cluster call raises KafkaException."""
    hook = getattr(partitioner, "on_partition_expansion", None)
    if partitioner is None or hook is None:
        return 0
    unfinished = _unfinished(admin, application_id)
    deadline = time.monotonic() + grace_s
    if unfinished:
        log.info("partition_expansion_callback_unfinished", markers=sorted(unfinished))
    while unfinished and time.monotonic() < deadline:
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        unfinished = _unfinished(admin, application_id)
    for marker, pairs in sorted(unfinished.items()):
        log.warning("partition_expansion_callback_rerun", marker=marker, changes=pairs)
        if run_callback(hook, pairs):
            mark_done(admin, marker, replication_factor, wait_s=_TIMEOUT_S)
    return len(unfinished)
