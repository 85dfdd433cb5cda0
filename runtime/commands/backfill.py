"""`streams-runtime backfill MODULE:ATTR`: run a topology over its source
topics' history on Spark (runtime.spark.backfill), then commit the end
offsets so `run` continues live. Exit 0 on success, 1 on a failed job,
2 on bad input (including no Java). The CLI process's main thread (Spark's
driver).
"""

from __future__ import annotations

import argparse
import sys

from runtime.commands.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    load_config_and_topology,
)
from runtime.commands.spark_session import start_spark


def main(args: argparse.Namespace) -> int:
    """`backfill`: run the job; the exit code."""
    from runtime.kafka.topics import TopicError
    from runtime.spark.plan import BackfillError
    from runtime.spark.session import JavaMissingError, Progress, SparkUnavailableError

    loaded = load_config_and_topology(args)
    if isinstance(loaded, int):
        return loaded
    config, topology = loaded
    try:
        from runtime.spark.plan import check_nodes
        from runtime.spark.preflight import check_backfill_topics

        check_nodes(topology)  # unsupported steps fail before Spark starts
        check_backfill_topics(topology, config, args.target)  # and so do missing topics
        spark, created = start_spark(args, f"streams-runtime backfill {config.application_id}")
    except (BackfillError, JavaMissingError, SparkUnavailableError, TopicError, ValueError) as exc:
        print(f"streams-runtime backfill: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        from runtime.spark.backfill import run_backfill
        from runtime.spark.graph import BackfillRecordError

        run_backfill(
            spark,
            topology,
            config,
            progress=Progress("backfill", quiet=args.quiet),
            commit=not args.no_commit,
            source=args.source,
        )
    except BackfillRecordError as exc:
        print(f"streams-runtime backfill: failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (BackfillError, TopicError) as exc:
        print(f"streams-runtime backfill: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # Spark's errors; a worker's error arrives as text
        reason = _find_cause(exc, BackfillRecordError)
        if reason is None:
            from runtime.spark.failures import failure_reason

            reason = failure_reason(exc)
        print(f"streams-runtime backfill: failed: {reason}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if created:
            spark.stop()
    return EXIT_OK


def _find_cause(exc: BaseException, kind: type[BaseException]) -> BaseException | str | None:
    """`exc` or a cause of it of type `kind`; for errors raised in Spark's Python
    workers (which reach the driver as text), the line naming `kind`."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kind):
            return seen
        seen = seen.__cause__ or seen.__context__
    marker = f"{kind.__name__}: "
    for line in str(exc).splitlines():
        if marker in line:
            return line[line.index(marker) + len(marker) :].strip()
    return None
