"""The CLI's subcommands that are more than a call into the app.

`expand` (grow a topic's partitions, with the app following) and
`scale_down` (ask a fraction of the instances to leave). `runtime.cli` only
parses arguments and dispatches here or to the daemon.

Threads: the caller's (a CLI process's main thread).
"""
