"""The `streams-runtime` command line: parses arguments, then runs one command.

Subcommands: run, topics create, expand, scale-down, admin, broker, demo,
audit, backfill. Each one's body is `runtime.commands.<name>`, imported only
when that subcommand runs (`_command`), so a quick `admin status` loads
neither the app, Kafka's clients nor Spark. Exit codes are theirs
(runtime.commands.common): 0 done, 1 failed, 2 bad input, 130/143 a signal
before the daemon started anything; `main` adds argparse's 2 for a bad
command line and 0 when stdout's reader went away.

The main thread of the CLI process.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from runtime.commands.common import EXIT_OK


def _command(module: str, function: str = "main") -> Callable[[argparse.Namespace], int]:
    """`runtime.commands.<module>.<function>`, imported when called."""

    def command(args: argparse.Namespace) -> int:
        body = getattr(importlib.import_module(f"runtime.commands.{module}"), function)
        code: int = body(args)
        return code

    command.__name__ = f"{module}.{function}"
    return command


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
    run.set_defaults(func=_command("run"))

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
    create.set_defaults(func=_command("topics", "create"))

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
    expand.set_defaults(func=_command("expand"))

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
    scale_down.set_defaults(func=_command("scale_down"))

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
    broker.set_defaults(func=_command("broker"))

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
    demo.set_defaults(func=_command("demo"))

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
    processes = admin_sub.add_parser(
        "processes",
        parents=[options],
        help="list, add, remove or set processing processes (processes > 1)",
    )
    processes.add_argument("action", nargs="?", choices=("add", "remove", "set"))
    processes.add_argument("count", nargs="?", type=int, help="process count for `set`")
    processes.add_argument(
        "--wait", type=float, metavar="S", help="seconds to wait for the processes to settle"
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
    admin.set_defaults(func=_command("admin"))

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
    audit.set_defaults(func=_command("audit"))

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
    backfill.set_defaults(func=_command("backfill"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    admin_command = getattr(args, "admin_command", None)
    if admin_command in ("threads", "processes"):
        what = admin_command.removesuffix("es").removesuffix("s")
        if args.action == "set" and args.count is None:
            parser.error(f"admin {admin_command} set needs a {what} count N")
        if args.action != "set" and args.count is not None:
            parser.error(f"a {what} count goes with `admin {admin_command} set N` only")
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
