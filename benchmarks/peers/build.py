"""The peers' programs, built on demand into a cache outside the repository.

- ``kafka_streams_jar()``: the Maven project in ``benchmarks/peers/kafka_streams``
  copied to ``<cache>/kafka-streams-<hash>/`` and built there with
  ``mvn -q -B package``; the hash covers the pom and every source file, so a
  changed source builds again and an unchanged one is built once per machine.
- ``quix_python()``: a virtualenv ``<cache>/quix-venv-<hash>/`` with
  ``requirements-quix.txt`` installed (quixstreams pins confluent-kafka < 2.13,
  older than the runtime's, so it cannot live in the project's environment).

``<cache>`` is ``$STREAMS_RUNTIME_CACHE/peers`` or ``~/.cache/streams-runtime/peers``.
A file lock serialises concurrent builds (a test and a benchmark at once).
Called by the harness's main thread and by tests; never by a measured run.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
KS_PROJECT = HERE / "kafka_streams"
QUIX_REQUIREMENTS = HERE / "requirements-quix.txt"
JAR_NAME = "ks-peer.jar"


class PeerUnavailable(RuntimeError):
    """A peer cannot be built here (no Java, no Maven, no network for a first build)."""


def cache_dir() -> Path:
    root = os.environ.get("STREAMS_RUNTIME_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "streams-runtime"
    )
    return Path(root) / "peers"


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _tree_hash(paths: list[Path], root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def _ks_sources() -> list[Path]:
    return [KS_PROJECT / "pom.xml", *(p for p in (KS_PROJECT / "src").rglob("*") if p.is_file())]


def java_missing() -> str | None:
    """Why the Kafka Streams peer cannot be built or run here, or None."""
    for tool in ("java", "mvn"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH (the Kafka Streams peer needs Java 17+ and Maven)"
    return None


def kafka_streams_jar(log: object = None) -> Path:
    """The runnable jar of the Kafka Streams peer, built if its sources changed.

    Raises ``PeerUnavailable`` when Java or Maven is missing or the build fails.
    """
    reason = java_missing()
    if reason:
        raise PeerUnavailable(reason)
    target = cache_dir() / f"kafka-streams-{_tree_hash(_ks_sources(), KS_PROJECT)}"
    jar = target / "target" / JAR_NAME
    if jar.exists():
        return jar
    with _locked("kafka-streams"):
        if jar.exists():
            return jar
        work = target.with_name(target.name + ".building")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        shutil.copy2(KS_PROJECT / "pom.xml", work / "pom.xml")
        shutil.copytree(KS_PROJECT / "src", work / "src")
        _say(log, f"building the Kafka Streams peer in {target} (mvn -q -B package)")
        proc = subprocess.run(
            ["mvn", "-q", "-B", "package"],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
        if proc.returncode != 0 or not (work / "target" / JAR_NAME).exists():
            raise PeerUnavailable(
                f"mvn package failed (exit {proc.returncode}) in {work}:\n"
                + (proc.stdout + proc.stderr)[-3000:]
            )
        shutil.rmtree(target, ignore_errors=True)
        work.rename(target)
    return jar


def quix_python(log: object = None) -> Path:
    """The Python of a virtualenv with quixstreams, created if missing.

    Raises ``PeerUnavailable`` if the virtualenv cannot be created or installed.
    """
    digest = hashlib.sha256(QUIX_REQUIREMENTS.read_bytes() + sys.version.encode()).hexdigest()[:12]
    venv = cache_dir() / f"quix-venv-{digest}"
    python = venv / "bin" / "python"
    marker = venv / ".installed"
    if marker.exists():
        return python
    with _locked("quix"):
        if marker.exists():
            return python
        shutil.rmtree(venv, ignore_errors=True)
        _say(log, f"creating the quixstreams virtualenv {venv}")
        steps = [
            [sys.executable, "-m", "venv", str(venv)],
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "-q",
                "-r",
                str(QUIX_REQUIREMENTS),
            ],
        ]
        for step in steps:
            proc = subprocess.run(step, capture_output=True, text=True, timeout=900, check=False)
            if proc.returncode != 0:
                raise PeerUnavailable(
                    f"{' '.join(step[:4])} failed (exit {proc.returncode}):\n"
                    + (proc.stdout + proc.stderr)[-3000:]
                )
        marker.touch()
    return python


def quix_version(python: Path) -> str:
    proc = subprocess.run(
        [
            str(python),
            "-c",
            "import quixstreams, confluent_kafka as c; "
            "print(f'quixstreams {quixstreams.__version__}, confluent-kafka {c.__version__} / "
            "librdkafka {c.libversion()[0]}')",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "?"


def java_version() -> str:
    try:
        proc = subprocess.run(
            ["java", "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError:
        return "?"
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return lines[0] if lines else "?"


def _say(log: object, message: str) -> None:
    if callable(log):
        log(message)
    else:
        print(f"[peers] {message}", flush=True)
