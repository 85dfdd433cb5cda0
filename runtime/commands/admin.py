"""`streams-runtime admin ...`: one request to a running daemon's admin socket.

Turns the parsed subcommand into the socket's command name and arguments
(`threads set 2` -> `threads.set` with `count`), finds the socket and hands
over to `runtime.admin.client.run_admin`, which prints the reply. The CLI
process's main thread.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from runtime.commands.common import EXIT_BAD_INPUT


def main(args: argparse.Namespace) -> int:
    """`admin`: send the command, print the reply; the exit code."""
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
    elif command == "processes" and args.action is not None:
        command = f"processes.{args.action}"
        if args.action == "set":
            arguments["count"] = args.count
        if args.wait is not None:
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
