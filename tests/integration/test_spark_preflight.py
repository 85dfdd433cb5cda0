"""`audit` and `backfill` check their topics before Spark starts (issue 32).

A missing topic used to be found only once Spark was up (62 s for `audit` to say
"topic not available"). Now one metadata request finds it: exit 2 (bad input, as
before), one line naming every missing topic and the `topics create` command,
within a few seconds, and Spark is never started.

"Never started" is proven with a JAVA_HOME whose `java` only records that it ran:
starting Spark runs it (the Java check, then spark-submit's JVM), so a record-free
run is one where Spark was not even tried.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime import StreamsBuilder, Topology, serdes
from tests.harness import REPO, clean_env
from tests.kafka_helpers import create_topic, unique_name

pytestmark = pytest.mark.integration

# Python's start and the imports take a second or two; Spark's start takes ten
# seconds to a minute. The check itself answers in milliseconds, plus at most
# 2 s of looking again for a topic created a moment before.
FEW_SECONDS = 10.0


def copy_from_env() -> Topology:
    """For `streams-runtime backfill tests.integration.test_spark_preflight:copy_from_env`:
    reads PREFLIGHT_SOURCE, writes PREFLIGHT_SINK through PREFLIGHT_THROUGH."""
    builder = StreamsBuilder()
    (
        builder.stream(os.environ["PREFLIGHT_SOURCE"], value_serde=serdes.STRING)
        .map_values(str.upper)
        .through(os.environ["PREFLIGHT_THROUGH"])
        .to(os.environ["PREFLIGHT_SINK"])
    )
    return builder.build()


def recording_java_home(tmp_path: Path) -> tuple[str, Path]:
    """(JAVA_HOME, the file its `java` appends its arguments to when it runs)."""
    record = tmp_path / "java-ran"
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f'#!/bin/sh\necho "$@" >> "{record}"\nexit 1\n')
    java.chmod(0o755)
    return str(tmp_path / "jdk"), record


def run_cli(
    args: list[str], java_home: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "runtime", *args],
        cwd=REPO,
        env=clean_env(JAVA_HOME=java_home, **env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
    )
    return result, time.monotonic() - started


def test_audit_names_a_missing_output_topic_without_starting_spark(
    bootstrap: str, tmp_path: Path
) -> None:
    source = unique_name("pf-in")
    create_topic(bootstrap, source, 1)
    missing = unique_name("pf-missing-out")
    java_home, java_ran = recording_java_home(tmp_path)

    result, seconds = run_cli(
        ["audit", "--bootstrap", bootstrap, "--input", source, "--output", missing], java_home
    )

    assert result.returncode == 2, result.stderr[-3000:]
    assert not java_ran.exists(), f"Spark was started: java ran with {java_ran.read_text()!r}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith(f"streams-runtime audit: output topic {missing!r} does not exist")
    assert source not in lines[0]  # the input exists: only the missing topic is named
    assert "streams-runtime topics create MODULE:ATTR --partitions N" in lines[0]
    assert seconds < FEW_SECONDS, f"{seconds:.1f} s"
    assert result.stdout == ""


def test_audit_names_every_missing_topic(bootstrap: str, tmp_path: Path) -> None:
    inp, out = unique_name("pf-gone-in"), unique_name("pf-gone-out")
    java_home, java_ran = recording_java_home(tmp_path)

    result, seconds = run_cli(
        ["audit", "--bootstrap", bootstrap, "--input", inp, "--output", out, "--json"],
        java_home,
    )

    assert result.returncode == 2, result.stderr[-3000:]
    assert not java_ran.exists()
    assert result.stderr.strip() == (
        f"streams-runtime audit: input topic {inp!r} and output topic {out!r} do not exist at "
        f"{bootstrap}: create them with `streams-runtime topics create MODULE:ATTR "
        "--partitions N`, MODULE:ATTR naming the topology that reads and writes them "
        "(or check --bootstrap and the topic names)"
    )
    assert seconds < FEW_SECONDS, f"{seconds:.1f} s"


def test_backfill_names_missing_topics_and_its_create_command_without_starting_spark(
    bootstrap: str, tmp_path: Path
) -> None:
    source, through, sink = (unique_name(f"pf-bf-{n}") for n in ("in", "through", "out"))
    create_topic(bootstrap, source, 2)  # the history exists; `through` and the sink do not
    java_home, java_ran = recording_java_home(tmp_path)
    target = "tests.integration.test_spark_preflight:copy_from_env"

    result, seconds = run_cli(
        ["backfill", target, "--set", f"bootstrap.servers={bootstrap}"]
        + ["--set", f"application.id={unique_name('pf-bf')}"],
        java_home,
        PREFLIGHT_SOURCE=source,
        PREFLIGHT_THROUGH=through,
        PREFLIGHT_SINK=sink,
    )

    assert result.returncode == 2, result.stderr[-3000:]
    assert not java_ran.exists(), f"Spark was started: java ran with {java_ran.read_text()!r}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0] == (
        f"streams-runtime backfill: output topic {through!r} (subtopology 0) does not exist; "
        f"source topic {through!r} (subtopology 1) does not exist; "
        f"output topic {sink!r} (subtopology 1) does not exist; "
        f"create them with `streams-runtime topics create {target} --partitions N` "
        "(same --config/--set as the backfill)"
    )
    assert seconds < FEW_SECONDS, f"{seconds:.1f} s"
