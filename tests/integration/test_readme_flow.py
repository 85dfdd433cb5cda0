"""The README's first steps, as a new user takes them (issue 20's "done when"):
copy the example, create its topics with the one documented command, run it
with the documented command, feed it with the documented snippet, and see the
output within seconds. Every command comes from README.md itself, pointed at
the session's broker."""

from __future__ import annotations

import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.harness import REPO, clean_env
from tests.kafka_helpers import wait_until

pytestmark = pytest.mark.integration

README = (REPO / "README.md").read_text()


def _block(language: str, marker: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)
    return next(b for b in blocks if marker in b)


def _commands(bootstrap: str) -> list[list[str]]:
    """The bash block with `topics create` and `run`, one argv per command."""
    text = _block("bash", "streams-runtime topics create").replace("\\\n", " ")
    text = text.replace("127.0.0.1:9092", bootstrap)
    return [
        [sys.executable, "-m", "runtime", *shlex.split(line)[1:]]
        for line in text.splitlines()
        if line.startswith("streams-runtime ")
    ]


def test_readme_example_topics_run_and_feed(bootstrap: str, tmp_path: Path) -> None:
    (tmp_path / "wordsplit.py").write_text(_block("python", "builder.build()"))
    feed = _block("python", "# feed.py").replace("127.0.0.1:9092", bootstrap)
    (tmp_path / "feed.py").write_text(feed)
    create, run = _commands(bootstrap)
    # The default state.dir lives under TMPDIR; the default admin socket under
    # XDG_RUNTIME_DIR, private to this test, so that `admin status` finds this
    # daemon alone (not another test's, nor a stale one's).
    # Short: under a pytest-xdist worker's longer tmp_path the socket path
    # would pass the 107-byte Unix limit, and the daemon would fall back to
    # the shared /tmp/streams-runtime-<uid>, where other tests' daemons live.
    runtime_dir = Path(tempfile.mkdtemp(prefix="xdg-", dir="/tmp"))
    env = clean_env(TMPDIR=str(tmp_path), XDG_RUNTIME_DIR=str(runtime_dir))
    env["PYTHONPATH"] = f"{tmp_path}:{REPO}"

    made = subprocess.run(create, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert sorted(line.split()[:2] for line in made.stdout.splitlines()) == [
        ["created", t]
        for t in ("lines-with-heartbeats", "long-words", "text-lines", "word-lengths")
    ]

    log_path = tmp_path / "daemon.log"
    started = time.monotonic()
    with open(log_path, "wb") as log:
        daemon = subprocess.Popen(
            run, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    try:
        wait_until(
            lambda: '"phase": "processing"' in log_path.read_text() or daemon.poll() is not None,
            30,
        )
        assert daemon.poll() is None, log_path.read_text()[-3000:]
        # "a `waiting for` line in `streams-runtime admin status`": with no
        # admin.socket set it answers from the daemon's default socket (issue 32).
        assert "`streams-runtime admin status`" in README
        status = subprocess.run(
            [sys.executable, "-m", "runtime", "admin", "status"], cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert status.returncode == 0, status.stderr
        assert status.stdout.startswith("state") and "wordsplit" in status.stdout, status.stdout
        fed = subprocess.run(
            [sys.executable, "feed.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert fed.returncode == 0, fed.stderr
        seen = time.monotonic() - started
        lines = set(fed.stdout.splitlines())
        assert {
            "word-lengths b'hello' 5",
            "word-lengths b'kafka' 5",
            "word-lengths b'streams' 7",
            "long-words None b'extraordinarily'",
        } <= lines, fed.stdout
        # From `run` to the output printed: start-up, the feed, its 5 s idle poll.
        assert seen < 25, f"output after {seen:.1f} s"
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0, log_path.read_text()[-3000:]
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(10)
        shutil.rmtree(runtime_dir, ignore_errors=True)
