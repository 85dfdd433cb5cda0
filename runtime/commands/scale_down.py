"""`streams-runtime scale-down --fraction F`: ask a fraction of the instances to leave.

Writes one request on the application's status topic; the placer (runtime-owned
placement, `task.assignment=runtime`) picks that fraction of the instances in
the group (at least one always stays), names them in its next plan, and each of
them hands its tasks over and exits as after `admin prepare-leave`. `main` is
the command. Runs on the CLI's main thread.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from confluent_kafka import Producer

from runtime.commands.common import EXIT_BAD_INPUT, EXIT_OK
from runtime.config import ConfigError, StreamsConfig, load_config
from runtime.kafka.clients import producer_config
from runtime.placement.records import SCALE_DOWN_KEY, status_topic_name


class ScaleDownError(RuntimeError):
    """The request could not be written (the reason says why)."""


def request_scale_down(config: StreamsConfig, fraction: float, timeout: float = 30.0) -> str:
    """Write the request; the status topic's name. Raises ScaleDownError."""
    if not 0.0 < fraction < 1.0:
        raise ScaleDownError(f"--fraction must be between 0 and 1 (exclusive), got {fraction}")
    if config.task_assignment != "runtime":
        raise ScaleDownError("scale-down needs task.assignment=runtime (in the app's config)")
    topic = status_topic_name(config.application_id)
    failures: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    producer = Producer(producer_config(config, {}))
    value = json.dumps({"fraction": fraction, "ts": int(time.time() * 1000)}).encode()
    producer.produce(topic, value, SCALE_DOWN_KEY, partition=0, on_delivery=on_delivery)
    if producer.flush(timeout) > 0:
        raise ScaleDownError(f"the request to {topic!r} was not delivered within {timeout} s")
    if failures:
        raise ScaleDownError(f"the request to {topic!r} failed: {failures[0]}")
    return topic


def main(args: argparse.Namespace) -> int:
    """Ask `--fraction` of the instances to hand their tasks over and leave."""

    try:
        config = load_config(args.config, args.set or ())
        topic = request_scale_down(config, args.fraction)
    except (ConfigError, ScaleDownError) as exc:
        print(f"streams-runtime scale-down: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(
        f"requested on {topic}: {args.fraction:g} of the instances hand their tasks over and exit"
    )
    return EXIT_OK
