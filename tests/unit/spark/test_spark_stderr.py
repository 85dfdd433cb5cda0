"""The JVM's incubator-module notice is left out of stderr at Spark's start (issue 32).

Spark's launcher always adds `--add-modules=jdk.incubator.vector` and the JVM then
prints `WARNING: Using incubator modules: jdk.incubator.vector`; no option turns it
off, so `spark_session` gives the JVM a pipe for stderr and copies it on without that
line. Here: the filter on every way the bytes can arrive, and the pipe with a real
child process standing in for the JVM. (The integration test
`test_spark_audit.py::test_a_clean_audit_prints_no_spark_log_lines` checks a real
`streams-runtime audit`.)
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from runtime.spark.session import (
    JVM_VECTOR_NOTICE,
    _jvm_stderr_without_notice,
    _JvmNoticeFilter,
)

NOTICE = JVM_VECTOR_NOTICE.decode()
JVM_OUTPUT = (
    f"{NOTICE}\n"
    "26/11/27 07:00:00 ERROR Executor: Exception in task 0.0\n"
    "\r[Stage 0:>      (0 + 2) / 4]\r[Stage 0:=====>  (2 + 2) / 4]\n"
    f"{NOTICE}\n"  # a second one is not the JVM's boot notice: kept
).encode()
EXPECTED = JVM_OUTPUT[len(JVM_VECTOR_NOTICE) + 1 :]


def filtered(chunks: list[bytes]) -> bytes:
    notice = _JvmNoticeFilter()
    return b"".join(notice.feed(c) for c in chunks) + notice.flush()


@pytest.mark.parametrize("size", [1, 2, 7, 30, 54, 55, 56, 1000])
def test_the_notice_is_dropped_however_the_bytes_arrive(size: int) -> None:
    chunks = [JVM_OUTPUT[i : i + size] for i in range(0, len(JVM_OUTPUT), size)]
    assert filtered(chunks) == EXPECTED


def test_other_lines_pass_untouched_and_partial_lines_at_once() -> None:
    notice = _JvmNoticeFilter()
    # A progress bar redraws one line: each piece must show as it comes.
    assert notice.feed(b"\r[Stage 1:>   (0 + 1) / 2]") == b"\r[Stage 1:>   (0 + 1) / 2]"
    assert notice.feed(b"\r[Stage 1:=>  (1 + 1) / 2]") == b"\r[Stage 1:=>  (1 + 1) / 2]"
    assert notice.feed(b"\nWARN") == b"\n"  # could still be the notice: held
    assert notice.feed(b": something else\n") == b"WARN: something else\n"
    # Another incubator module besides Spark's (a user's own --add-modules) is announced.
    other = f"{NOTICE}, jdk.incubator.foo\n".encode()
    assert filtered([other]) == other
    # A Windows line end, and the notice alone at the end of the stream.
    assert filtered([JVM_VECTOR_NOTICE + b"\r\nnext\n"]) == b"next\n"
    assert filtered([JVM_VECTOR_NOTICE]) == JVM_VECTOR_NOTICE  # no line end: not the JVM's line


def test_a_child_started_inside_writes_through_the_filter(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A child process inherits the pipe as its stderr (as PySpark's JVM does), keeps
    writing to it after the block, and the process's own stderr is restored."""
    script = (
        "import sys, time\n"
        f"sys.stderr.write({NOTICE!r} + '\\n'); sys.stderr.flush()\n"
        "sys.stderr.write('started\\n'); sys.stderr.flush()\n"
        "sys.stdin.read()\n"  # until the parent says: as PySpark's JVM, alive after the start
        "sys.stderr.write('later\\n')\n"
    )
    with _jvm_stderr_without_notice():
        child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)
        print("from the parent, inside", file=sys.stderr)
    print("from the parent, after", file=sys.stderr)
    assert child.stdin is not None
    child.stdin.close()
    assert child.wait(30) == 0
    err = ""
    for _ in range(100):  # the copying thread delivers "later" on its own time
        err += capfd.readouterr().err
        if "later" in err:
            break
        time.sleep(0.05)
    assert NOTICE not in err
    for line in ("started", "from the parent, inside", "from the parent, after", "later"):
        assert line in err.splitlines(), err
