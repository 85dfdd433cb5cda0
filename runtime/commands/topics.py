"""`streams-runtime topics create MODULE:ATTR`: create a topology's missing
source and sink topics and list them all (internal topics are the daemon's).

The CLI process's main thread, with a short-lived admin client.
"""

from __future__ import annotations

import argparse
import sys

from runtime.commands.common import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    load_config_and_topology,
)


def create(args: argparse.Namespace) -> int:
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
