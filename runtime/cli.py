"""The `streams-runtime` command: run, topics, admin, broker, demo, audit, backfill.

Runs on the main thread. `run` starts the app, then hands the main thread to
the admin loop (`runtime.admin.daemon.run_daemon`): signals in gunicorn's shape
(SIGTERM/SIGINT close the app gracefully, SIGTTIN adds a processing thread,
SIGTTOU removes one), the admin socket and the metrics endpoint. Exit codes:
0 clean shutdown (SIGTERM or SIGINT once the app started included), 1 the
app failed, 2 bad input (config, topology, topics), 130/143 SIGINT/SIGTERM
before the app started anything (`runtime.admin.signals`).
`topics create` makes a topology's missing source and sink topics; `expand`
grows an input topic and everything downstream of it (partition expansion).
`admin` talks to a running daemon over its socket (`runtime.admin.client`).
`audit` and `backfill` are Spark jobs (`runtime.spark`): exit 0 on success,
1 on a mismatch or a failed job, 2 on bad input (including no Java).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from runtime.topology.loading import load_topology

if TYPE_CHECKING:
    from runtime.admin.signals import StartupSignals

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # as a shell reports a process ended by SIGINT


def load_config_and_topology(
    args: argparse.Namespace,
    base: dict[str, Any] | None = None,
    log_level: str | None = None,
    named: bool = False,
) -> tuple[Any, Any] | int:
    """`--config`/`--set`/env and MODULE:ATTR, with logging set up; an exit
    code (bad input) instead when either is wrong, the reason on stderr.
    `base`: values the config sources override; `log_level`: instead of
    `log.level` (a one-shot command's own output is what the user reads)."""
    from runtime.config import ConfigError, load_config
    from runtime.logging import configure_logging

    try:
        config = load_config(args.config, args.set or (), base=base)
    except ConfigError as exc:
        print(f"streams-runtime: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    configure_logging(log_level or config.log_level)
    try:
        topology = load_topology(args.target, named=named)
    except Exception as exc:
        # One line whatever the target or the user's exception says.
        from runtime.config_values import one_line

        print(
            f"streams-runtime: cannot load topology {one_line(args.target)}: {one_line(str(exc))}",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    return config, topology


def cmd_run(args: argparse.Namespace) -> int:
    # SIGTERM and SIGINT are handled before anything else is done: until the
    # app starts they end the command with one line and 128 + the signal's
    # number; from App.start() on they close the app gracefully, exit 0
    # (runtime.admin.signals). Whatever the parent set (a shell's background
    # job inherits SIGINT ignored).
    from runtime.admin.signals import Interrupted, StartupSignals

    signals = StartupSignals().install()
    try:
        return _run(args, signals)
    except Interrupted as exc:
        print(
            f"streams-runtime: {exc.signal.name} during start-up; stopped before "
            "the app started anything",
            file=sys.stderr,
        )
        return exc.exit_code


def _run(args: argparse.Namespace, signals: StartupSignals) -> int:
    """`run` under `signals` (a StartupSignals), which may raise Interrupted
    until `App.start()` is called, and during its wait for the cluster."""
    from runtime.admin.daemon import (
        DaemonSetupError,
        preflight,
        raise_open_files_limit,
        run_daemon,
    )
    from runtime.app import App
    from runtime.config import ConfigError
    from runtime.kafka.cluster import wait_for_cluster
    from runtime.kafka.topics import TopicError
    from runtime.topology.errors import SerializationError
    from runtime.topology.named_queries import QueryError

    loaded = load_config_and_topology(args, named=True)
    if isinstance(loaded, int):
        return loaded
    config, topology = loaded
    try:
        admin_socket = preflight(config)
        raise_open_files_limit()
        app = App(topology, config, source=args.target)
        # From here a signal is recorded, and acted on by the daemon once
        # start() returns (start() may be half-way through starting
        # threads), except in the wait for the cluster: nothing started yet.
        signals.defer(wait_for_cluster)
        app.start()
    except (ConfigError, TopicError, DaemonSetupError, SerializationError, QueryError) as exc:
        print(f"streams-runtime: {str(exc).replace('MODULE:ATTR', args.target)}", file=sys.stderr)
        return EXIT_BAD_INPUT

    # The daemon owns its process: what start-up made (modules, the topology,
    # the app) lives as long as the process, so the cyclic GC stops scanning
    # it. Each full collection scanned all of it holding the GIL, every
    # thread stopped: 24-35 ms per collection in the queries benchmark's
    # daemon (four in 60 s), none over 5 ms once frozen.
    gc.freeze()
    code = run_daemon(app, signals=signals, admin_socket=admin_socket)
    if code == EXIT_FAILED and app.failure is not None:
        # The last line a user sees says why (the log has the details).
        print(f"streams-runtime: the app failed: {_reason(app.failure)}", file=sys.stderr)
    elif signals.first_shutdown is not None:
        outcome = "shut down gracefully" if code == EXIT_OK else "the shutdown failed (see the log)"
        print(f"streams-runtime: {signals.first_shutdown.name}: {outcome}", file=sys.stderr)
    return code


def _reason(failure: BaseException) -> str:
    """A task failure says which task and stage and the user's error; other
    failures get their type."""
    if isinstance(getattr(failure, "cause", None), BaseException):
        return str(failure)
    return f"{type(failure).__name__}: {failure}"


def cmd_topics_create(args: argparse.Namespace) -> int:
    """Create the topology's missing source and sink topics; list them all."""
    # application.id names nothing here (internal topics are the daemon's),
    # so the run command's settings work as they are, and so does none.
    loaded = load_config_and_topology(
        args, base={"application.id": "streams-runtime-topics"}, log_level="warning"
    )
    if isinstance(loaded, int):
        return loaded
    config, topology = loaded
    # Imported after logging is set up: module loggers keep the level they
    # were first used with, and the created topics are printed below.
    from runtime.config import ConfigError
    from runtime.kafka.cluster import StartupAdmin
    from runtime.kafka.startup_checks import check_client_properties
    from runtime.kafka.topics import TopicError, create_user_topics

    partitions = args.partitions or config.topics_create_partitions
    replication = (
        args.replication_factor
        if args.replication_factor is not None
        else config.replication_factor
    )
    try:
        check_client_properties(config)
        admin = StartupAdmin(config)
        admin.wait_for_cluster()
        topics = create_user_topics(admin.client, topology, partitions, replication)
    except (ConfigError, TopicError) as exc:
        print(f"streams-runtime topics: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("streams-runtime topics: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    width = max((len(t.name) for t in topics), default=0)
    for topic in topics:
        verb = "created" if topic.created else "exists "
        plural = "s" if topic.partitions != 1 else ""
        print(f"{verb}  {topic.name.ljust(width)}  {topic.partitions} partition{plural}")
    if not topics:
        print("the topology reads and writes no topics of its own")
    return EXIT_OK


def cmd_expand(args: argparse.Namespace) -> int:
    """Grow an input topic and everything downstream of it, downstream first."""
    loaded = load_config_and_topology(args, log_level="warning")
    if isinstance(loaded, int):
        return loaded
    config, topology = loaded
    from runtime.commands.expand import expand_topic
    from runtime.config import ConfigError
    from runtime.kafka.cluster import StartupAdmin
    from runtime.kafka.startup_checks import check_client_properties
    from runtime.kafka.topics import TopicError

    if config.static_partitioner is None and not args.force:
        print(
            f"streams-runtime expand: static.partitioner is not set for {config.application_id!r}: "
            "its running instances would stop when the topic grows (Kafka's default "
            "partitioner moves keys away from their state). Set static.partitioner (here and "
            "in the app's config), or pass --force and repartition the app offline.",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    try:
        check_client_properties(config)
        admin = StartupAdmin(config)
        admin.wait_for_cluster()
        topics = expand_topic(
            admin.client, topology, config.application_id, args.topic, args.partitions
        )
    except (ConfigError, TopicError) as exc:
        print(f"streams-runtime expand: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("streams-runtime expand: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    width = max((len(t.name) for t in topics), default=0)
    for topic in topics:
        verb = "expanded " if topic.grown else "unchanged"
        counts = f"{topic.before} -> {topic.after}" if topic.grown else f"{topic.after}"
        print(f"{verb}  {topic.name.ljust(width)}  {counts}  ({topic.role})")
    return EXIT_OK


def cmd_scale_down(args: argparse.Namespace) -> int:
    """Ask `--fraction` of the instances to hand their tasks over and leave."""
    from runtime.commands.scale_down import ScaleDownError, request_scale_down
    from runtime.config import ConfigError, load_config

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


def cmd_admin(args: argparse.Namespace) -> int:
    from runtime.admin.client import locate_socket, run_admin
    from runtime.admin.paths import DefaultSocketError

    command = args.admin_command
    arguments: dict[str, Any] = {}
    if command == "threads" and args.action is not None:
        command = f"threads.{args.action}"
        if args.action == "set":
            arguments["count"] = args.count
        if args.action in ("remove", "set") and args.wait is not None:
            arguments["timeout"] = args.wait
    elif command in ("pause", "resume") and args.task is not None:
        arguments["task"] = args.task
    elif command == "query":
        # `query add MODULE:ATTR --name N`; `query remove|pause|resume N`.
        command = f"query.{args.action}"
        if args.action == "add":
            name = args.name or args.name_arg
            if args.target is None or name is None:
                print(
                    "streams-runtime admin: usage: query add MODULE:ATTR --name N",
                    file=sys.stderr,
                )
                return EXIT_BAD_INPUT
            arguments["target"] = args.target
            for key in ("priority", "weight", "max_threads", "isolation"):
                if getattr(args, key) is not None:
                    arguments[key] = getattr(args, key)
        else:
            name = args.name or args.target
            if name is None or args.name_arg is not None:
                print(f"streams-runtime admin: usage: query {args.action} N", file=sys.stderr)
                return EXIT_BAD_INPUT
        arguments["name"] = name
        if args.action == "remove" and args.reset:
            arguments["reset"] = True
    try:
        path = locate_socket(args.socket, args.config, args.application_id)
    except DefaultSocketError as exc:
        print(f"streams-runtime admin: no socket: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (OSError, ValueError) as exc:
        print(f"streams-runtime admin: cannot read {args.config}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return run_admin(path, command, arguments, as_json=args.json, timeout=args.timeout)


def cmd_broker(args: argparse.Namespace) -> int:
    from runtime.brokers import run_foreground

    return run_foreground(kind=args.kind, port=args.port, host=args.host)


def cmd_demo(args: argparse.Namespace) -> int:
    from runtime.demo import run_demo

    return run_demo(
        duration=args.duration,
        rate=args.rate,
        threads=args.threads,
        partitions=args.partitions,
        broker_kind=args.broker,
    )


def _spark_conf(pairs: Sequence[str] | None) -> dict[str, str]:
    conf = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--spark-conf expects key=value, got {pair!r}")
        conf[key.strip()] = value.strip()
    return conf


def _start_spark(args: argparse.Namespace, app_name: str) -> tuple[Any, bool]:
    """(session, created): the active session if there is one, else a new one."""
    from runtime.spark.session import check_pyspark, spark_session

    check_pyspark()
    from pyspark.sql import SparkSession

    existed = SparkSession.getActiveSession() is not None
    conf = _spark_conf(args.spark_conf)
    if args.source is not None:
        from runtime.spark.names import SOURCE_CONF

        # Also tells spark_session() not to fetch the connector for streams-kafka.
        conf[SOURCE_CONF] = args.source
    spark = spark_session(args.master, app_name, conf, log_level=args.spark_log_level)
    return spark, not existed


def cmd_audit(args: argparse.Namespace) -> int:
    from runtime.spark.kafka import KafkaSourceError
    from runtime.spark.preflight import check_audit_topics
    from runtime.spark.session import JavaMissingError, SparkUnavailableError

    try:
        check_audit_topics(args.bootstrap, args.input, args.output)  # seconds; Spark: a minute
        spark, created = _start_spark(args, "streams-runtime audit")
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


def cmd_backfill(args: argparse.Namespace) -> int:
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
        spark, created = _start_spark(args, f"streams-runtime backfill {config.application_id}")
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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _replication_factor(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value != -1 and not 1 <= value <= 32767:
        raise argparse.ArgumentTypeError(f"expected 1-32767 or -1 (the broker's), got {text!r}")
    return value


def _add_admin_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """`admin`'s options; with `defaults=False` an option not given leaves the
    value parsed before the command alone (argparse.SUPPRESS)."""

    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--socket",
        metavar="PATH",
        default=default(None),
        help="the admin socket (default: $STREAMS_RUNTIME_ADMIN_SOCKET, admin.socket of "
        "--config, else the daemon's default socket, found by --application-id or alone)",
    )
    parser.add_argument(
        "--application-id",
        metavar="ID",
        default=default(None),
        help="find the default socket of this application's daemon (default: application.id "
        "of --config or $STREAMS_RUNTIME_APPLICATION_ID; else the only daemon answering)",
    )
    parser.add_argument(
        "--config",
        metavar="app.toml",
        default=default(None),
        help="read admin.socket from this file",
    )
    parser.add_argument(
        "--json", action="store_true", default=default(False), help="print the raw result as JSON"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=default(10.0),
        help="seconds to wait for a reply (default 10)",
    )


def _add_spark_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument(
        "--spark-conf",
        action="append",
        metavar="key=value",
        help="a Spark setting (repeatable), e.g. spark.driver.memory=2g",
    )
    parser.add_argument(
        "--spark-log-level",
        default="FATAL",
        type=str.upper,
        choices=("ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF"),
        help="Spark's own log level (default FATAL: a failed job ends with its Python error)",
    )
    parser.add_argument(
        "--source",
        choices=("kafka", "streams-kafka"),
        help="how Spark reads Kafka: kafka (Spark's own connector, the default, fetched with "
        "Maven on first use) or streams-kafka (the project's Python data source, no JVM package)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streams-runtime", description="Run Kafka stream-processing topologies."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a topology as a daemon")
    run.add_argument(
        "target",
        metavar="MODULE:ATTR",
        help="a Topology or a function returning one; MODULE is a module name or a .py file",
    )
    run.add_argument("--config", metavar="app.toml", help="TOML configuration file")
    run.add_argument(
        "--set", action="append", metavar="key=value", help="a configuration value (repeatable)"
    )
    run.set_defaults(func=cmd_run)

    topics = sub.add_parser(
        "topics",
        help="create the topics a topology reads and writes",
        description="Manage the user topics of a topology (internal topics are the daemon's).",
    )
    topics_sub = topics.add_subparsers(dest="topics_command", required=True, metavar="COMMAND")
    create = topics_sub.add_parser(
        "create",
        help="create the topology's missing source and sink topics",
        description=(
            "Create the source and sink topics of MODULE:ATTR that do not exist yet (existing "
            "ones are listed, never changed). Takes the same --config/--set as `run`; only "
            "bootstrap.servers (and admin.* client settings) matter here."
        ),
    )
    create.add_argument(
        "target", metavar="MODULE:ATTR", help="a Topology or a function returning one"
    )
    create.add_argument(
        "--partitions",
        type=_positive_int,
        metavar="N",
        help="partitions of each new topic (default: topics.create.partitions, 1); "
        "the most tasks, so busy threads, per subtopology",
    )
    create.add_argument(
        "--replication-factor",
        type=_replication_factor,
        metavar="R",
        help="replicas of each new topic (default: replication.factor, -1: the broker's default)",
    )
    create.add_argument("--config", metavar="app.toml", help="TOML configuration file")
    create.add_argument(
        "--set", action="append", metavar="key=value", help="a configuration value (repeatable)"
    )
    create.set_defaults(func=cmd_topics_create)

    expand = sub.add_parser(
        "expand",
        help="grow an input topic and everything downstream of it (partition expansion)",
        description=(
            "Grow TOPIC, an input topic of MODULE:ATTR, to N partitions, and before it, "
            "downstream first: the output topics written downstream of it, the app's internal "
            "topics (application.id from --config/--set) and the topics co-partitioned with "
            "it. Topics that have N already are left alone, so it may be run again. A running "
            "app with static.partitioner follows the expansion live; without one it stops, "
            "so this refuses unless --force."
        ),
    )
    expand.add_argument(
        "target", metavar="MODULE:ATTR", help="a Topology or a function returning one"
    )
    expand.add_argument("topic", metavar="TOPIC", help="the input topic to grow")
    expand.add_argument(
        "--partitions", type=_positive_int, metavar="N", required=True, help="the new count"
    )
    expand.add_argument(
        "--force",
        action="store_true",
        help="expand even without static.partitioner (the app must then be repartitioned offline)",
    )
    expand.add_argument("--config", metavar="app.toml", help="TOML configuration file")
    expand.add_argument(
        "--set", action="append", metavar="key=value", help="a configuration value (repeatable)"
    )
    expand.set_defaults(func=cmd_expand)

    scale_down = sub.add_parser(
        "scale-down",
        help="task.assignment=runtime: ask a fraction of the instances to leave",
        description=(
            "Ask FRACTION of the application's instances (application.id from "
            "--config/--set) to hand their tasks over and exit 0, as `admin prepare-leave` "
            "does for one; the placer picks them, and at least one instance stays."
        ),
    )
    scale_down.add_argument(
        "--fraction", type=float, required=True, metavar="F", help="between 0 and 1, e.g. 0.2"
    )
    scale_down.add_argument("--config", metavar="app.toml", help="TOML configuration file")
    scale_down.add_argument(
        "--set", action="append", metavar="key=value", help="a configuration value (repeatable)"
    )
    scale_down.set_defaults(func=cmd_scale_down)

    broker = sub.add_parser(
        "broker",
        help="start a development broker (Apache Kafka or Tansu)",
        description="Run one local broker until Ctrl-C. kafka: Apache Kafka (KRaft, one node; "
        "needs Java 17+, fetched with Maven on first use); tansu: the Tansu binary (no Java, "
        "in memory); auto (default): kafka if it can run here, else tansu.",
    )
    broker.add_argument("--kind", choices=("kafka", "tansu", "auto"), default="auto")
    broker.add_argument("--port", type=int, default=9092)
    broker.add_argument("--host", default="127.0.0.1")
    broker.set_defaults(func=cmd_broker)

    demo = sub.add_parser("demo", help="broker + sample app + load, with a live view")
    demo.add_argument(
        "--duration", type=float, default=None, help="seconds (default: until Ctrl-C)"
    )
    demo.add_argument("--rate", type=int, default=20000, help="input records per second")
    demo.add_argument("--threads", type=int, default=2, help="processing threads")
    demo.add_argument("--partitions", type=int, default=8)
    demo.add_argument(
        "--broker",
        choices=("kafka", "tansu", "auto"),
        default="auto",
        help="auto (default): Apache Kafka if Java and Maven (or a cached copy) are here, "
        "else Tansu",
    )
    demo.set_defaults(func=cmd_demo)

    admin = sub.add_parser(
        "admin",
        help="control a running daemon through its admin socket",
        description="Talk to a running daemon over its admin socket (admin.socket).",
    )
    _add_admin_options(admin, defaults=True)
    # The same options after the command (`admin threads --json`): each
    # subcommand accepts them too, without defaults of its own, so a value
    # given before the command is kept unless repeated after it.
    options = argparse.ArgumentParser(add_help=False)
    _add_admin_options(options, defaults=False)
    admin_sub = admin.add_subparsers(dest="admin_command", required=True, metavar="COMMAND")
    admin_sub.add_parser(
        "status", parents=[options], help="state, threads, tasks, counters, lag, last commit"
    )
    admin_sub.add_parser(
        "tasks", parents=[options], help="tasks with owner, buffered records and lag"
    )
    threads = admin_sub.add_parser(
        "threads", parents=[options], help="list, add, remove or set processing threads"
    )
    threads.add_argument("action", nargs="?", choices=("add", "remove", "set"))
    threads.add_argument("count", nargs="?", type=int, help="thread count for `set`")
    threads.add_argument(
        "--wait", type=float, metavar="S", help="seconds to wait for a thread's batch to end"
    )
    for name, verb in (("pause", "stop"), ("resume", "restart")):
        p = admin_sub.add_parser(
            name, parents=[options], help=f"{verb} processing a task (default: all tasks)"
        )
        p.add_argument("task", nargs="?", help="task id such as 0_1 (default: all)")
    admin_sub.add_parser(
        "queries", parents=[options], help="named queries: state, share, rate, lag, latency"
    )
    query = admin_sub.add_parser(
        "query",
        parents=[options],
        help="add, remove, pause or resume a named query",
        description="query add MODULE:ATTR --name N | query remove N | query pause N | "
        "query resume N",
    )
    query.add_argument("action", choices=("add", "remove", "pause", "resume"))
    query.add_argument("target", nargs="?", help="add: MODULE:ATTR of the query's topology")
    query.add_argument("name_arg", nargs="?", metavar="N", help="the query's name")
    query.add_argument("--name", help="the query's name (add)")
    query.add_argument("--priority", type=int, help="add: query.<name>.priority")
    query.add_argument("--weight", type=int, help="add: query.<name>.weight")
    query.add_argument("--max-threads", dest="max_threads", type=int, help="add: thread cap")
    query.add_argument(
        "--isolation",
        choices=("thread", "process"),  # the admin socket checks it against the config
        help="add: query.<name>.isolation (process: a child process of the daemon)",
    )
    query.add_argument("--reset", action="store_true", help="remove: delete offsets and state")
    admin_sub.add_parser("shutdown", parents=[options], help="graceful shutdown (as SIGTERM)")
    admin_sub.add_parser(
        "prepare-leave",
        parents=[options],
        help="task.assignment=runtime: hand this instance's tasks over, then exit 0",
    )
    admin.set_defaults(func=cmd_admin)

    audit = sub.add_parser(
        "audit",
        help="check an output topic against an input topic (Spark job)",
        description=(
            "Check an output topic against its input topic with Spark (read_committed). "
            "identity: each input record once in the output; counts: the output's latest "
            "count per key equals the input's records per key. Prints missing, duplicated "
            "and unexpected records; exits 1 on a mismatch."
        ),
    )
    audit.add_argument("--bootstrap", "--bootstrap-servers", required=True, metavar="HOST:PORT")
    audit.add_argument("--input", required=True, metavar="TOPIC")
    audit.add_argument("--output", required=True, metavar="TOPIC")
    audit.add_argument("--relation", choices=("identity", "counts"), default="identity")
    audit.add_argument(
        "--id",
        choices=("record", "key", "value"),
        default="record",
        help="identity: what identifies a record (default: key and value bytes)",
    )
    audit.add_argument(
        "--id-field", metavar="FIELD", help="identity: a field of the JSON value, in both topics"
    )
    audit.add_argument(
        "--key-field",
        metavar="FIELD",
        help="counts: count input records by this JSON value field (default: the input key)",
    )
    audit.add_argument(
        "--value-format",
        choices=("int64", "string"),
        default="int64",
        help="counts: how output values encode counts (default int64, 8 bytes big-endian)",
    )
    audit.add_argument(
        "--isolation-level",
        choices=("read_committed", "read_uncommitted"),
        default="read_committed",
    )
    audit.add_argument("--samples", type=int, default=10, help="examples shown per kind")
    audit.add_argument("--json", action="store_true", help="print the report as JSON")
    _add_spark_options(audit)
    audit.set_defaults(func=cmd_audit)

    backfill = sub.add_parser(
        "backfill",
        help="run a topology over its source topics' history on Spark",
        description=(
            "Run a DSL topology's stateless steps and aggregations over the history of its "
            "source topics on Spark, write the output and the stores' changelogs, and commit "
            "the end offsets for the group application.id, so that `streams-runtime run` with "
            "the same application.id restores the state and continues live."
        ),
    )
    backfill.add_argument(
        "target", metavar="MODULE:ATTR", help="a Topology or a function returning one"
    )
    backfill.add_argument("--engine", choices=("spark",), default="spark")
    backfill.add_argument("--config", metavar="app.toml", help="TOML configuration file")
    backfill.add_argument(
        "--set", action="append", metavar="key=value", help="a configuration value (repeatable)"
    )
    backfill.add_argument(
        "--no-commit",
        action="store_true",
        help="write output and changelogs but commit no offsets (a dry run for the daemon)",
    )
    backfill.add_argument("--quiet", action="store_true", help="no progress lines")
    _add_spark_options(backfill)
    backfill.set_defaults(func=cmd_backfill)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "admin_command", None) == "threads":
        if args.action == "set" and args.count is None:
            parser.error("admin threads set needs a thread count N")
        if args.action != "set" and args.count is not None:
            parser.error("a thread count goes with `admin threads set N` only")
    try:
        result: int = args.func(args)
        # Flushed here, inside the try: a reader that went away (`| head`)
        # must not turn into a traceback at interpreter exit.
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_closed_stdout()
        return EXIT_OK
    return result


def _quiet_closed_stdout() -> None:
    """stdout's reader closed the pipe: whatever is left unwritten is dropped,
    and Python's flush at exit must not report it (it would print a traceback)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is no real file (a test capture)
        pass
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
