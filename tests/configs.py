"""The settings an integration test's app starts from: one factory, `app_config`.

Why: most integration tests run an app (in-process `App` or a daemon's
`--set` flags) with the same few settings: a short commit interval so output
shows up fast, a short session timeout and heartbeat so a stopped instance
leaves its group in seconds, and the test's own state directory. Each test
module used to spell that dict out itself; now they state only where they
differ from it.

Every default can be turned off (`None` leaves the setting out, so the
runtime's own default applies): a test that ran on the runtime's default
commit interval or heartbeat keeps doing so.

Threads: pure function; any thread may call it.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["app_config"]


def app_config(
    bootstrap: str,
    app_id: str,
    state_dir: Path | str,
    *,
    threads: int | None = 2,
    commit_ms: int | None = 200,
    guarantee: str | None = None,
    session_ms: int | None = 6000,
    heartbeat_ms: int | None = 500,
    **extra: object,
) -> dict[str, object]:
    """An app config: the shared settings, then `extra` (dotted keys through
    `**{"a.b": value}`; `extra` wins over everything before it).

    `threads` is `processing.threads`, `commit_ms` `commit.interval.ms`,
    `guarantee` `processing.guarantee`, `session_ms` and `heartbeat_ms` the
    consumer's `session.timeout.ms` and `heartbeat.interval.ms`. `None` leaves
    a setting out (`guarantee` is left out unless given). `state_dir` becomes a
    string, which is also what a daemon's `--set state.dir=...` receives.
    """
    config: dict[str, object] = {
        "application.id": app_id,
        "bootstrap.servers": bootstrap,
        "state.dir": str(state_dir),
    }
    optional: dict[str, object | None] = {
        "processing.guarantee": guarantee,
        "processing.threads": threads,
        "commit.interval.ms": commit_ms,
        "consumer.session.timeout.ms": session_ms,
        "consumer.heartbeat.interval.ms": heartbeat_ms,
    }
    config.update({key: value for key, value in optional.items() if value is not None})
    config.update(extra)
    return config
