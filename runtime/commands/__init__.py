"""The CLI's subcommands, one module each; `runtime.cli` only parses arguments.

`run` (the daemon), `topics` (create a topology's topics), `expand` (grow a
topic's partitions, with the app following), `scale_down` (ask a fraction of
the instances to leave), `admin` (one request to a daemon's socket),
`broker` and `demo` (development), `audit` and `backfill` (Spark jobs, with
`spark_session`). `common` holds the exit codes and the config/topology
loading they share. Each command is a `main(args) -> exit code` (`topics`:
`create`), imported only when it runs, so `admin status` loads neither the
app nor Spark.

Threads: the caller's (a CLI process's main thread).
"""
