"""Starting Spark for the pipeline: the Java check, Kafka on the classpath, a small local
session, progress lines.

`spark_session()` checks for Java first (Spark 4 needs Java 17+) and raises
`JavaMissingError` with what to install instead of py4j's opaque failure. It puts Spark's
own Kafka connector on the classpath (`format("kafka")`: fetched with Maven into the
project's cache on first use, `runtime.spark.connector`), unless the configuration brings
it already (`spark.jars.packages`) or asks for the project's source only
(`spark.streamsRuntime.kafkaSource=streams-kafka`); and it registers the project's data
source (`format("streams-kafka")`). The
defaults suit a shared 2-core machine: `local[2]`, a 1 GB driver, no web UI,
few shuffle partitions; `conf` overrides any of them, and `master` may point
at a cluster. Spark's Python workers run this interpreter
(`PYSPARK_PYTHON`), with the caller's `sys.path` on their `PYTHONPATH`, so
topology modules and the functions inside them import there as here.

`Progress` prints one line per stage of a long job to stderr; Spark's own
console progress bar shows too when stderr is a terminal (it is switched off
otherwise, where its carriage returns would garble logs).

The JVM's `WARNING: Using incubator modules: jdk.incubator.vector` at every
start is left out of stderr (`_JvmNoticeFilter`): Spark's launcher always
passes `--add-modules=jdk.incubator.vector` (the Vector API, for MLlib's
vectorized BLAS; nothing the project runs uses it), the JVM announces every
incubator module it resolves, and no JVM or Spark option turns either off.
So the JVM starts with its stderr on a pipe, and a thread copies what comes
through to the real stderr without that one line.

Called from the main thread of the driver process.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any

from runtime.spark.failures import JavaMissingError, SparkUnavailableError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MIN_JAVA = 17

DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.driver.memory": "1g",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.session.timeZone": "UTC",
    "spark.python.worker.reuse": "true",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
}


# Spark's JVM logs through log4j2. Its default profile prints WARN lines at
# every start (the native-hadoop library, the default profile itself) and an
# executor's full Java + Python stack trace at ERROR when a task fails: ~200
# lines burying the one line that matters, which the CLI prints last
# (runtime.spark.failures). This profile is in force from the JVM's first
# line; `spark_session(log_level=...)` sets the level once the session is up.
_QUIET_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
# A shell's (PySpark's gateway's) own level: equal to the root's, Spark does
# not print "Setting default log level to ..." at start.
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
logger.pygateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.pygateway.level = error
"""

DEFAULT_LOG_LEVEL = "FATAL"


def _quiet_log4j2_file() -> str:
    """The quiet profile as a file the JVM can read (written once per content)."""
    digest = hashlib.sha256(_QUIET_LOG4J2.encode()).hexdigest()[:12]
    path = os.path.join(tempfile.gettempdir(), f"streams-runtime-log4j2-{digest}.properties")
    if not os.path.exists(path):
        fd, partial = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".partial")
        with os.fdopen(fd, "w") as out:
            out.write(_QUIET_LOG4J2)
        os.replace(partial, path)  # atomic: a concurrent start reads all or nothing
    return path


# What the JVM prints (System.err, at module-system boot) when Spark's launcher
# adds the Vector API module. Only this exact line is dropped: a user's own
# `--add-modules` of other incubator modules is still announced.
JVM_VECTOR_NOTICE = b"WARNING: Using incubator modules: jdk.incubator.vector"


class _JvmNoticeFilter:
    """Bytes as the JVM wrote them, minus the line `JVM_VECTOR_NOTICE`.

    The notice is printed once, as a whole line at the start of a line (the
    JVM's first output); once dropped, everything else passes untouched. Until
    then, bytes are held back only while they could still be that line, so
    partial lines (Spark's `\r`-redrawn progress bar) pass at once. Pure: the
    copying thread feeds it (`_copy_without_notice`).
    """

    def __init__(self, notice: bytes = JVM_VECTOR_NOTICE) -> None:
        self._lines = (notice + b"\n", notice + b"\r\n")
        self._held = b""
        self._line_start = True
        self.dropped = False

    def feed(self, data: bytes) -> bytes:
        """What to write now of `data` (and of what was held back)."""
        if self.dropped:
            return data
        data, self._held = self._held + data, b""
        out = bytearray()
        while data and not self.dropped:
            newline = data.find(b"\n")
            if not self._line_start:  # the rest of a line already passed on
                if newline < 0:
                    out += data
                    return bytes(out)
                out += data[: newline + 1]
                data, self._line_start = data[newline + 1 :], True
            elif newline < 0:  # a partial line: hold it only if it may be the notice
                if any(line.startswith(data) for line in self._lines):
                    self._held = data
                    return bytes(out)
                out += data
                self._line_start = False
                return bytes(out)
            else:
                line, data = data[: newline + 1], data[newline + 1 :]
                if line in self._lines:
                    self.dropped = True
                else:
                    out += line
        return bytes(out + data)

    def flush(self) -> bytes:
        """What is held back, at the end of the stream."""
        held, self._held = self._held, b""
        return held


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _copy_without_notice(source: int, target: int) -> None:
    """Copy `source` to `target` until every writer closed it, through
    `_JvmNoticeFilter`; closes both. A thread of its own: the JVM writes to
    its stderr for as long as it lives."""
    notice = _JvmNoticeFilter()
    try:
        while data := os.read(source, 65536):
            _write_all(target, notice.feed(data))
        _write_all(target, notice.flush())
    except OSError:
        pass  # the real stderr is gone (closed, or its reader went away)
    finally:
        os.close(source)
        os.close(target)


@contextlib.contextmanager
def _jvm_stderr_without_notice() -> Iterator[None]:
    """Within: a JVM started (PySpark's gateway) gets a pipe for stderr, whose
    copy to the real stderr leaves out `JVM_VECTOR_NOTICE`.

    Why the process's fd 2 and not PySpark's `launch_gateway(popen_kwargs=)`:
    the builder starts the gateway itself (no way to pass Popen arguments,
    short of building the SparkContext and its gateway by hand through
    PySpark's private attributes). While inside, the process's own writes to
    stderr take the same pipe and arrive unchanged; fd 2 is restored on the
    way out, and the JVM (and the processes it starts) keep the pipe: the
    copying thread lives as long as the JVM and ends at its end of file (at
    once when no JVM was started: a session made before). POSIX only;
    elsewhere, or when fd 2 is not open, nothing changes.
    """
    real: int | None = None
    if os.name == "posix":
        with contextlib.suppress(OSError, AttributeError, ValueError):  # no stderr to filter
            sys.stderr.flush()
            real = os.dup(2)
    if real is None:
        yield
        return
    read_end, write_end = os.pipe()  # both not inheritable; fd 2 below is
    copier = threading.Thread(
        target=_copy_without_notice,
        args=(read_end, os.dup(real)),
        name="spark-jvm-stderr",
        daemon=True,  # never holds the interpreter's exit for a JVM still running
    )
    copier.start()
    os.dup2(write_end, 2)
    os.close(write_end)
    failed = False
    try:
        yield
    except Exception:  # not KeyboardInterrupt: Ctrl-C is not kept waiting
        failed = True
        raise
    finally:
        with contextlib.suppress(OSError, AttributeError, ValueError):
            sys.stderr.flush()
        os.dup2(real, 2)
        os.close(real)
        if failed:
            # A JVM that failed to start has exited: let its last words (now in
            # the pipe) reach stderr before the caller's own message does.
            copier.join(timeout=2)


def find_java() -> str | None:
    """`$JAVA_HOME/bin/java` if JAVA_HOME is set, else `java` on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = os.path.join(home, "bin", "java")
        return candidate if os.access(candidate, os.X_OK) else None
    return shutil.which("java")


def check_java() -> str:
    """The Java version string; JavaMissingError if Java is absent or older than 17."""
    java = find_java()
    install = (
        "Spark needs a Java runtime, version 17 or newer: install one (Debian/Ubuntu: "
        "apt-get install openjdk-17-jre-headless) and put `java` on PATH or set JAVA_HOME"
    )
    if java is None:
        where = (
            f"JAVA_HOME={os.environ['JAVA_HOME']} has no bin/java"
            if os.environ.get("JAVA_HOME")
            else "no `java` on PATH and JAVA_HOME is not set"
        )
        raise JavaMissingError(f"{install} ({where}).")
    try:
        result = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaMissingError(f"{install} (`{java} -version` failed: {exc}).") from exc
    text = (result.stderr or "") + (result.stdout or "")
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if result.returncode != 0 or match is None:
        raise JavaMissingError(f"{install} (`{java} -version` said: {text.strip()[:200]!r}).")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_292" is Java 8
        major = int(match.group(2))
    if major < MIN_JAVA:
        raise JavaMissingError(f"{install} ({java} is Java {major}).")
    return text.strip().splitlines()[0]


def check_pyspark() -> str:
    """The PySpark version; SparkUnavailableError if missing or without Python data sources."""
    try:
        import pyspark
    except ImportError:
        raise SparkUnavailableError(
            "PySpark is not installed: pip install 'streams-runtime[spark]'"
        ) from None
    try:
        import pyspark.sql.datasource  # noqa: F401
    except ImportError:
        raise SparkUnavailableError(
            f"PySpark {pyspark.__version__} has no Python data source API "
            "(pyspark.sql.datasource, Spark 4.0+): pip install 'pyspark>=4.0'"
        ) from None
    return str(pyspark.__version__)


def _worker_pythonpath() -> str:
    paths = [os.getcwd()] + [p for p in sys.path if p and os.path.isdir(p)]
    existing = os.environ.get("PYTHONPATH", "")
    if existing:
        paths += existing.split(os.pathsep)
    return os.pathsep.join(dict.fromkeys(paths))


def spark_session(
    master: str = "local[2]",
    app_name: str = "streams-runtime",
    conf: Mapping[str, str] | None = None,
    log_level: str = DEFAULT_LOG_LEVEL,
    kafka_connector: bool | None = None,
) -> SparkSession:
    """The active SparkSession (as it is), or a new one with Spark's Kafka connector on its
    classpath; the project's data source is registered either way.

    `kafka_connector`: put `format("kafka")` on the classpath (fetching it with Maven on
    first use); None means yes unless `conf` selects the `streams-kafka` source
    (`runtime.spark.sources.SOURCE_CONF`). An active session is returned as it is: jars
    cannot be added to a running JVM.

    Spark logs only `log_level` and above (default FATAL: a failed job reaches
    the caller as an exception, see `runtime.spark.failures`; pass "WARN" or
    "INFO" to see Spark's own account). Raises JavaMissingError /
    SparkUnavailableError (ConnectorUnavailable when the connector cannot be
    fetched) before trying to start the JVM, ValueError for a bad source setting.
    """
    check_pyspark()
    from pyspark.sql import SparkSession

    from runtime.spark.names import STREAMS_KAFKA, conf_source
    from runtime.spark.source import register

    wanted = conf_source(conf or {})
    active = SparkSession.getActiveSession()
    if active is not None:
        register(active)
        return active
    check_java()
    extra: dict[str, str] = {}
    if kafka_connector if kafka_connector is not None else wanted != STREAMS_KAFKA:
        from runtime.spark.connector import connector_conf

        extra = connector_conf(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    # Spark's progress bar redraws one line with \r: only for a terminal.
    console = {"spark.ui.showConsoleProgress": "true" if sys.stderr.isatty() else "false"}
    # The quiet log profile from the JVM's start (a user's own
    # spark.driver.extraJavaOptions replaces it).
    quiet = {
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{_quiet_log4j2_file()}"
    }
    for key, value in {**DEFAULT_CONF, **quiet, **console, **(conf or {}), **extra}.items():
        builder = builder.config(key, value)
    # The JVM and, through it, the Python workers take these from the
    # environment at start-up; the process's own environment is left as it was.
    worker_env = {
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON", sys.executable),
        "PYTHONPATH": _worker_pythonpath(),
    }
    saved = {name: os.environ.get(name) for name in worker_env}
    os.environ.update(worker_env)
    try:
        with _jvm_stderr_without_notice():
            spark = builder.getOrCreate()
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
    spark.sparkContext.setLogLevel(log_level)
    register(spark)
    return spark


class Progress:
    """One line per stage of a job, with elapsed time: `[backfill 12.3s] message`."""

    def __init__(self, name: str, stream: IO[str] | None = None, quiet: bool = False) -> None:
        self.name = name
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.started = time.monotonic()

    def __call__(self, message: str, **fields: Any) -> None:
        if self.quiet:
            return
        extra = "".join(f" {k}={v}" for k, v in fields.items())
        elapsed = time.monotonic() - self.started
        print(f"[{self.name} {elapsed:6.1f}s] {message}{extra}", file=self.stream, flush=True)
