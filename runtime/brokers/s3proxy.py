"""S3Proxy: a real S3-compatible server on loopback, for the remote state tests and benchmarks.

Why S3Proxy: it is a real S3 server (request signing, ListObjectsV2, multi-object delete,
path-style buckets), published on Maven Central (``org.gaul:s3proxy``), so it is fetched the
way Kafka is (:func:`runtime.brokers.kafka_dist.ensure_maven_jars`, about 43 MB of jars, once)
and runs on the Java 17 the Kafka tests need anyway. Its ``filesystem-nio2`` backend keeps
objects as files under a directory of ours, so a test can look at (or damage) what was
stored. Never a mock: boto3 talks HTTP to it as it would to S3.

The server listens on 127.0.0.1 only, on a free port, with one access key (``env()`` gives the
``AWS_*`` variables a client needs). Start takes a few seconds (JVM start).

Threads: an :class:`S3Proxy` belongs to the thread that made it; ``pause``/``resume``
(SIGSTOP/SIGCONT, to freeze the server in the middle of an upload) from that thread too.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from runtime.brokers.kafka_dist import BrokerUnavailable, ensure_maven_jars, find_java

__all__ = ["S3PROXY_VERSION", "S3Proxy", "ensure_s3proxy"]

S3PROXY_VERSION = "2.6.0"

# S3Proxy logs through logback, at DEBUG when given no configuration (thousands of lines).
_LOGBACK_XML = """<configuration>
  <appender name="OUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d{HH:mm:ss.SSS} %-5level %logger{20} - %msg%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="OUT"/></root>
</configuration>
"""


def ensure_s3proxy(version: str = S3PROXY_VERSION) -> Path:
    """The cached S3Proxy ``version`` (its home: ``libs/``, ``logback.xml``), fetched if needed.

    Raises BrokerUnavailable when Java or Maven is missing or the fetch fails.
    """
    find_java()
    return ensure_maven_jars(
        "s3proxy",
        version,
        [("org.gaul", "s3proxy", version)],
        {"logback.xml": _LOGBACK_XML},
        label=f"S3Proxy {version}",
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class S3Proxy:
    """One S3Proxy process with a file-system backend under ``root`` (a temp dir by default)."""

    def __init__(
        self,
        root: Path | None = None,
        *,
        access_key: str = "streams-test",
        secret_key: str = "streams-test-secret",
        version: str = S3PROXY_VERSION,
    ) -> None:
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="s3proxy-")) if root is None else root
        self.access_key = access_key
        self.secret_key = secret_key
        self.version = version
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        """Where the backend keeps buckets (a directory each) and objects (files)."""
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        return self.root / "s3proxy.log"

    def env(self) -> dict[str, str]:
        """The AWS variables a client of this server needs."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
        }

    def start(self, timeout: float = 120.0) -> S3Proxy:
        """Start the server and wait until it accepts connections; returns self."""
        home = ensure_s3proxy(self.version)
        java = find_java()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        properties = self.root / "s3proxy.properties"
        properties.write_text(
            "\n".join(
                [
                    f"s3proxy.endpoint=http://127.0.0.1:{self.port}",
                    "s3proxy.authorization=aws-v2-or-v4",
                    f"s3proxy.identity={self.access_key}",
                    f"s3proxy.credential={self.secret_key}",
                    "jclouds.provider=filesystem-nio2",
                    "jclouds.identity=local",
                    "jclouds.credential=local",
                    f"jclouds.filesystem.basedir={self.data_dir}",
                    "",
                ]
            )
        )
        argv = [
            java,
            "-Xmx256m",
            "-XX:+UseSerialGC",
            f"-Dlogback.configurationFile={home / 'logback.xml'}",
            "-cp",
            str(home / "libs" / "*"),
            "org.gaul.s3proxy.Main",
            "--properties",
            str(properties),
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerUnavailable(
                    f"S3Proxy exited with code {self.proc.returncode}: {self._tail()}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                    return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise BrokerUnavailable(f"S3Proxy did not listen within {timeout:.0f} s: {self._tail()}")

    def client(self) -> Any:
        """A boto3 S3 client for this server (path-style, this server's key)."""
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=Config(
                s3={"addressing_style": "path"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): requests hang until `resume`."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Stop the process (by its pid) and delete a root we made."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)  # a paused JVM cannot handle SIGTERM
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.proc = None
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def _tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "<no log>"

    def __enter__(self) -> S3Proxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
