"""Apache Kafka's jars, fetched once with Maven into a cache outside the repository.

Why Maven: the machines this project runs on reach Maven Central but not the Apache download
mirrors, and Maven resolves the broker's exact runtime dependency set from the published pom
(``org.apache.kafka:kafka_2.13``). The jars land in ``<cache>/kafka-<version>/libs`` and are
reused by every later start; only the first start needs Maven (3-5 s here with a warm
``~/.m2``, longer when it downloads the 45 jars, about 43 MB).

The cache base is ``$STREAMS_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/streams-runtime``,
else ``~/.cache/streams-runtime``. (Not a ``STREAMS_RUNTIME_*`` variable: the runtime reads
those as configuration keys.) A file lock (``kafka-<version>.lock`` beside the directory)
serialises concurrent fetches (two test sessions starting at once); the jars are copied into a
temporary directory and renamed into place, so a reader never sees a half-filled ``libs``.

The same mechanism fetches other Java servers the tests and benchmarks run (S3Proxy, the
S3-compatible server of the remote state tests, see ``runtime/brokers/s3proxy.py``):
:func:`ensure_maven_jars` resolves any set of Maven artifacts into ``<cache>/<name>-<version>``.

Threads: :func:`ensure_kafka` and :func:`ensure_maven_jars` may be called from any thread and any
process at the same time.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "KAFKA_VERSION",
    "BrokerUnavailable",
    "KafkaDist",
    "cache_root",
    "ensure_kafka",
    "ensure_maven_jars",
    "find_java",
]

# The newest 4.x whose kafka_2.13 resolves with its dependencies on Maven Central (checked
# 2026-11-23). The log4j binding is not a dependency of the kafka_2.13 pom (the Apache
# distribution adds it to libs/ itself); Kafka 4.x logs through slf4j 1.7, hence the slf4j-1
# binding ``log4j-slf4j-impl``.
KAFKA_VERSION = "4.4.0"
LOG4J_VERSION = "2.24.3"
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
_MIN_JAVA = 17
_FETCH_TIMEOUT_S = 900.0
_COMPLETE_MARKER = ".complete"

log = logging.getLogger(__name__)


class BrokerUnavailable(RuntimeError):
    """Kafka cannot be run here: Java or Maven is missing, too old, or the fetch failed."""


@dataclass(frozen=True, slots=True)
class KafkaDist:
    """A usable Kafka installation: the java binary, the jars and a log4j2 configuration."""

    version: str
    java: str
    home: Path
    jars: tuple[Path, ...]
    log4j_config: Path

    @property
    def classpath(self) -> str:
        """The ``-cp`` value for ``java``."""
        return os.pathsep.join(str(jar) for jar in self.jars)

    @property
    def class_archive(self) -> Path:
        """Where the broker's class-data-sharing archive lives for this ``java`` binary.

        Why: loading Kafka's classes is most of a broker's start-up; with a dynamic CDS archive
        (written by the first broker that exits cleanly, see KafkaNode) a start takes about
        2 s instead of 3 here, and a cluster's JVMs share those pages. The archive only fits
        the JVM build that wrote it, hence one per java binary (a mismatch is ignored by the
        JVM with a warning, never fatal).
        """
        real = os.path.realpath(self.java)
        stat = os.stat(real)
        key = hashlib.sha1(f"{real}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
        return self.home / f"classes-{key[:12]}.jsa"


def cache_root() -> Path:
    """Where fetched brokers live (see the module docstring for the variables it honours)."""
    explicit = os.environ.get("STREAMS_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "streams-runtime"


def find_java() -> str:
    """The ``java`` binary (``$JAVA_HOME/bin/java`` first, then PATH), checked to be 17+.

    Raises BrokerUnavailable naming what to install when there is none or it is too old.
    """
    candidates: list[str] = []
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidates.append(os.path.join(java_home, "bin", "java"))
    on_path = shutil.which("java")
    if on_path:
        candidates.append(on_path)
    for java in candidates:
        if not os.access(java, os.X_OK):
            continue
        version = _java_major(java)
        if version is not None and version >= _MIN_JAVA:
            return java
        raise BrokerUnavailable(
            f"Apache Kafka {KAFKA_VERSION} needs Java {_MIN_JAVA} or newer; {java} is "
            f"{'of unknown version' if version is None else f'Java {version}'} "
            "(install openjdk-17-jre-headless or set JAVA_HOME)"
        )
    raise BrokerUnavailable(
        f"Apache Kafka needs Java {_MIN_JAVA}+, but no java was found on PATH or in JAVA_HOME "
        "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless); "
        "or run on the Tansu broker instead (STREAMS_TEST_BROKER=tansu / --kind tansu)"
    )


def _java_major(java: str) -> int | None:
    """The major version ``java -version`` reports (``17`` for "17.0.15", ``8`` for "1.8")."""
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2) is not None:
        return int(match.group(2))
    return major


def ensure_kafka(version: str = KAFKA_VERSION) -> KafkaDist:
    """Return the cached Kafka ``version``, fetching it with Maven first if it is not there.

    Raises BrokerUnavailable when Java is missing, or the jars are not cached and Maven is
    missing or fails (the message carries Maven's output).
    """
    java = find_java()
    home = ensure_maven_jars(
        "kafka",
        version,
        [
            ("org.apache.kafka", "kafka_2.13", version),
            ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
        ],
        {"log4j2.properties": _LOG4J2_PROPERTIES},
        label=f"Apache Kafka {version}",
        hint="; or run on the Tansu broker instead (STREAMS_TEST_BROKER=tansu / --kind tansu)",
    )
    jars = tuple(sorted((home / "libs").glob("*.jar")))
    if not any(jar.name.startswith("kafka_2.13-") for jar in jars):
        raise BrokerUnavailable(
            f"the Kafka cache {home} is incomplete (no kafka_2.13 jar); delete it to refetch"
        )
    return KafkaDist(
        version=version, java=java, home=home, jars=jars, log4j_config=home / "log4j2.properties"
    )


def ensure_maven_jars(
    name: str,
    version: str,
    dependencies: Sequence[tuple[str, str, str]],
    files: Mapping[str, str],
    *,
    label: str,
    hint: str = "",
) -> Path:
    """``<cache>/<name>-<version>``, holding ``libs/`` (the runtime dependency closure of
    ``dependencies``, each ``(groupId, artifactId, version)``) and ``files`` (name -> text);
    fetched with Maven first if not cached. ``label`` names the thing in messages, ``hint``
    is appended to the "Maven is missing" one.

    Raises BrokerUnavailable when Maven is missing or fails.
    """
    home = cache_root() / f"{name}-{version}"
    if not (home / _COMPLETE_MARKER).exists():
        home.parent.mkdir(parents=True, exist_ok=True)
        with _file_lock(home.parent / f"{name}-{version}.lock"):
            if not (home / _COMPLETE_MARKER).exists():  # another process may have won
                _fetch(name, version, home, dependencies, files, label, hint)
    return home


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fetch(
    name: str,
    version: str,
    home: Path,
    dependencies: Sequence[tuple[str, str, str]],
    files: Mapping[str, str],
    label: str,
    hint: str,
) -> None:
    """Resolve ``dependencies`` with Maven into ``home``, and write ``files`` beside them.

    Called with the fetch lock held. Everything is built in a sibling temp directory and
    renamed to ``home`` at the end, so an interrupted fetch leaves no half-filled cache.
    """
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerUnavailable(
            f"{label} is not cached in {home} and Maven (mvn) is not installed "
            f"to fetch it (Debian/Ubuntu: apt-get install maven){hint}"
        )
    log.warning("fetching %s with Maven into %s (first start only)", label, home)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-{version}-", dir=home.parent))
    try:
        (staging / "pom.xml").write_text(_pom(name, version, dependencies))
        for file_name, text in files.items():
            (staging / file_name).write_text(text)
        argv = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(staging / "pom.xml"),
            f"{_DEPENDENCY_PLUGIN}:copy-dependencies",
            f"-DoutputDirectory={staging / 'libs'}",
            "-DincludeScope=runtime",
        ]
        try:
            result = subprocess.run(
                argv, capture_output=True, text=True, timeout=_FETCH_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            raise BrokerUnavailable(
                f"Maven did not fetch {label} within {_FETCH_TIMEOUT_S:.0f} s"
            ) from None
        if result.returncode != 0:
            output = (result.stdout + result.stderr)[-3000:]
            raise BrokerUnavailable(
                f"Maven could not fetch {label} (exit {result.returncode}): "
                f"{' '.join(argv)}\n{output}"
            )
        (staging / _COMPLETE_MARKER).write_text(version + "\n")
        if home.exists():  # a stale, incomplete cache from an older layout or a crash
            shutil.rmtree(home)
        staging.rename(home)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _pom(name: str, version: str, dependencies: Sequence[tuple[str, str, str]]) -> str:
    entries = "".join(
        f"""
    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{artifact_version}</version>
    </dependency>"""
        for group, artifact, artifact_version in dependencies
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by streams-runtime (runtime/brokers/kafka_dist.py) to fetch {name}'s jars. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.streams-runtime</groupId>
  <artifactId>{name}-jars</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>{entries}
  </dependencies>
</project>
"""


# Broker logs go to stdout, which the broker's owner sends to its log file. WARN by default:
# at INFO a broker writes thousands of lines per start and per created topic. The start-up and
# shutdown milestones stay at INFO so a log shows when the node was up. The level can be raised
# per run with -Dstreams.kafka.log.level=INFO (KafkaBroker's log_level argument).
_LOG4J2_PROPERTIES = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = ${sys:streams.kafka.log.level:-WARN}
rootLogger.appenderRef.out.ref = OUT
logger.raft.name = kafka.server.KafkaRaftServer
logger.raft.level = INFO
logger.broker.name = kafka.server.BrokerServer
logger.broker.level = INFO
logger.controller.name = kafka.server.ControllerServer
logger.controller.level = INFO
"""
