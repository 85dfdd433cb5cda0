"""`streams-runtime audit` on Spark local[2]: a clean run passes, an injected duplicate and an
injected loss are found and named, for both relations (identity and per-key counts), reading
with Spark's connector (the default) and with the project's source (the option)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from confluent_kafka import Producer

from runtime.cli import main
from runtime.spark import DEFAULT_SOURCE, SOURCES, run_audit, spark_session
from runtime.topology import serdes
from tests.harness import REPO, clean_env
from tests.kafka_helpers import create_topic, produce, unique_name

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def spark():  # type: ignore[no-untyped-def]
    """The process's one local[2] session (see test_spark_source)."""
    return spark_session("local[2]", "streams-runtime-tests")


def topics(bootstrap: str, *names: str) -> list[str]:
    out = []
    for name in names:
        topic = unique_name(name)
        create_topic(bootstrap, topic, 3)
        out.append(topic)
    return out


RECORDS = [(f"order-{i}", json.dumps({"id": i, "amount": i % 97})) for i in range(5000)]


def produce_transactionally(
    bootstrap: str, topic: str, records: list[tuple[str, str]], abort_first: bool
) -> None:
    """`records` in a committed transaction, after an aborted one holding a copy of them
    (`abort_first`: Tansu shows aborted records to read_committed readers)."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique_name("au-tx")})
    producer.init_transactions(30)
    for commit in (False, True) if abort_first else (True,):
        producer.begin_transaction()
        for key, value in records:
            producer.produce(topic, key=key, value=value)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)


@pytest.mark.parametrize("source", SOURCES)
def test_identity_audit_passes_a_clean_copy_and_finds_a_duplicate_and_a_loss(
    spark: Any, bootstrap: str, capsys: Any, source: str, on_kafka: bool
) -> None:
    inp, clean, duplicated, lossy = topics(bootstrap, "au-in", "au-clean", "au-dup", "au-loss")
    produce(bootstrap, inp, RECORDS)
    # An exactly-once copy, in another order, after an aborted attempt (read_committed).
    produce_transactionally(bootstrap, clean, list(reversed(RECORDS)), abort_first=on_kafka)
    produce(bootstrap, duplicated, [*RECORDS, RECORDS[1234]])
    produce(bootstrap, lossy, RECORDS[:777] + RECORDS[778:])

    ok = run_audit(spark, bootstrap, inp, clean, source=source)
    assert ok.ok and (ok.input_records, ok.output_records) == (5000, 5000)
    assert ok.source == source

    dup = run_audit(spark, bootstrap, inp, duplicated, source=source)
    assert (dup.missing, dup.duplicated, dup.unexpected) == (0, 1, 0)
    assert "order-1234" in dup.samples["duplicated"][0]

    lost = run_audit(spark, bootstrap, inp, lossy, id_field="id", source=source)
    assert (lost.missing, lost.duplicated, lost.unexpected) == (1, 0, 0)
    assert lost.samples["missing"] == ["id=777: 0 in output, 1 in input"]
    if source != DEFAULT_SOURCE:
        return  # the command line (this session: the default source) once is enough

    # Through the command line: the report names the lost record, exit code 1.
    argv = ["audit", "--bootstrap", bootstrap, "--input", inp, "--relation", "identity"]
    assert main([*argv, "--output", lossy, "--id-field", "id"]) == 1
    out = capsys.readouterr().out
    assert "missing     1 records" in out and "id=777" in out and "result: MISMATCH" in out
    assert main([*argv, "--output", clean, "--id", "key"]) == 0
    assert "result: OK" in capsys.readouterr().out


def test_counts_audit_checks_latest_count_per_key(spark: Any, bootstrap: str, capsys: Any) -> None:
    source, good, bad = topics(bootstrap, "au-words", "au-counts", "au-bad-counts")
    words = [(w, "x") for w in ["a"] * 5 + ["b"] * 3 + ["c"]]
    produce(bootstrap, source, words)
    int64 = serdes.INT64.serialize
    # A table of running counts: only the latest value per key counts.
    produce(bootstrap, good, [("a", int64(2)), ("a", int64(5)), ("b", int64(3)), ("c", int64(1))])
    produce(bootstrap, bad, [("a", int64(5)), ("b", int64(4)), ("d", int64(1))])  # c lost, b high

    assert run_audit(spark, bootstrap, source, good, relation="counts").ok
    report = run_audit(spark, bootstrap, source, bad, relation="counts")
    assert (report.missing, report.duplicated, report.unexpected) == (1, 1, 1)
    assert report.keys == 3

    argv = ["audit", "--bootstrap", bootstrap, "--input", source, "--output", bad]
    assert main([*argv, "--relation", "counts", "--json"]) == 1
    parsed = json.loads(capsys.readouterr().out)
    assert parsed["ok"] is False and parsed["unexpected"] == 1


def test_a_missing_topic_is_bad_input(spark: Any, bootstrap: str, capsys: Any) -> None:
    (source,) = topics(bootstrap, "au-only")
    missing = unique_name("au-missing")
    argv = ["audit", "--bootstrap", bootstrap, "--input", source, "--output", missing]
    assert main(argv) == 2
    assert missing in capsys.readouterr().err


def _bad_row(x: int) -> int:
    raise ValueError(f"bad row {x}")


def test_a_failed_job_ends_with_the_workers_python_error(
    spark: Any, capsys: Any, monkeypatch: Any
) -> None:
    """A job that fails in a Python worker: the last line is the worker's error,
    not PySpark's preamble (and no Java stack trace is printed)."""

    def failing_audit(*args: Any, **kwargs: Any) -> Any:
        return spark.sparkContext.parallelize([1]).map(_bad_row).collect()

    monkeypatch.setattr("runtime.spark.audit.run_audit", failing_audit)
    # No cluster at 127.0.0.1:9: the topics check before Spark starts is not this test's.
    monkeypatch.setattr("runtime.spark.preflight.check_audit_topics", lambda *a, **k: None)
    argv = ["audit", "--bootstrap", "127.0.0.1:9", "--input", "in", "--output", "out"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "streams-runtime audit: failed: ValueError: bad row 1 (raised in a Spark Python worker)"
    )


def test_a_clean_audit_prints_no_spark_log_lines(bootstrap: str) -> None:
    """Spark's own log is quiet by default, and the JVM's start too: only the report,
    on stdout; nothing on stderr."""
    source, copy = topics(bootstrap, "au-quiet-in", "au-quiet-out")
    produce(bootstrap, source, RECORDS[:100])
    produce(bootstrap, copy, RECORDS[:100])
    # The project's source, selected by --source: no connector is fetched either.
    result = subprocess.run(
        [sys.executable, "-m", "runtime", "audit", "--bootstrap", bootstrap]
        + ["--input", source, "--output", copy, "--master", "local[1]"]
        + ["--source", "streams-kafka"],
        cwd=REPO,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "result: OK" in result.stdout
    assert "read with streams-kafka" in result.stdout
    # Nothing at all, not even the JVM's notice about the incubator module Spark's
    # launcher adds (`WARNING: Using incubator modules: jdk.incubator.vector`, issue 32).
    assert result.stderr.strip() == "", result.stderr[-3000:]
