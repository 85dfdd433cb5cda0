"""Child processes of the daemon: process-isolated named queries
(`query.<name>.isolation=process`) and processing processes (`processes` > 1).

`process` is the one way to run a child (spec line, events, commands,
request/reply over its pipes); `plan` derives what a child runs with from
the daemon's config (pure); `child` is the child's entry point for both
roles (`python -m runtime.isolation.child`); `supervisor` and `queries` are
an isolated query's side in the daemon; `workers` is the supervisor of a
daemon with several processing processes (`slots`: a slot's history and
restart backoff), `merge` and `pool_metrics` its merged status and
`/metrics`.
"""
