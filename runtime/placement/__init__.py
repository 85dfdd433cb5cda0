"""Where tasks run: standby placement, and runtime-owned task placement.

`records` holds what instances tell each other on the compacted
`<application.id>-status` topic (status, placement plans, scale-down
requests) and the rendezvous hashing of standbys; `placer` is the pure
placer of `task.assignment=runtime` (learners first, then moves);
`runtime_assignment` follows plans and, on the instance that owns the
coordination partition, places.

Threads: `records` and `placer` are pure; `RuntimeAssignment` runs on the
polling thread (inside rebalance callbacks and its loop turn), and its
figures are read racily by status.
"""
