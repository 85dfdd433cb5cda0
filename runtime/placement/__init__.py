"""Where tasks run: standby placement, and runtime-owned task placement.

`records` holds what instances tell each other on the compacted
`<application.id>-status` topic (status, placement plans, scale-down
requests) and the rendezvous hashing of standbys; `status_reader` reads that
topic on the restoration thread's loop into `status_view`, which hands the
polling thread one immutable `StatusSnapshot`; `placer` is the pure placer
of `task.assignment=runtime` (learners first, then moves). Runtime-owned
placement on the polling thread: `runtime_assignment` (the coordinator the
polling thread calls: rebalance callbacks, the membership check, one loop
turn) routes to `plan_follower` (every instance: applies plans, publishes
its status, leaves) and `placer_role` (the elected instance: computes and
publishes plans); `parts` groups what they are built from.

Threads: `records` and `placer` are pure; `status_reader` runs on the
restoration thread; the roles run on the polling thread, and other threads
read only immutable snapshots (`StatusSnapshot`, `PlacementFigures`).
"""
