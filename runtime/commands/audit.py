"""`streams-runtime audit`: check an output topic against its input topic
with a Spark job (runtime.spark.audit). Exit 0 when they match, 1 on a
mismatch or a failed job, 2 on bad input (including no Java). The CLI
process's main thread (Spark's driver).
"""

from __future__ import annotations

import argparse
import sys

from runtime.commands.common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from runtime.commands.spark_session import start_spark


def main(args: argparse.Namespace) -> int:
    """`audit`: run the check, print the report; the exit code."""
    from runtime.spark.kafka import KafkaSourceError
    from runtime.spark.preflight import check_audit_topics
    from runtime.spark.session import JavaMissingError, SparkUnavailableError

    try:
        check_audit_topics(args.bootstrap, args.input, args.output)  # seconds; Spark: a minute
        spark, created = start_spark(args, "streams-runtime audit")
    except (JavaMissingError, KafkaSourceError, SparkUnavailableError, ValueError) as exc:
        print(f"streams-runtime audit: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        from runtime.spark.audit import report_json, run_audit

        report = run_audit(
            spark,
            args.bootstrap,
            args.input,
            args.output,
            relation=args.relation,
            id_mode=args.id,
            id_field=args.id_field,
            key_field=args.key_field,
            value_format=args.value_format,
            isolation=args.isolation_level,
            samples=args.samples,
            source=args.source,
        )
    except (KafkaSourceError, ValueError) as exc:
        print(f"streams-runtime audit: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # Spark's errors: the worker's Python error, if there is one
        from runtime.spark.failures import failure_reason

        print(f"streams-runtime audit: failed: {failure_reason(exc)}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if created:
            spark.stop()
    print(report_json(report) if args.json else report.render())
    return EXIT_OK if report.ok else EXIT_FAILED
