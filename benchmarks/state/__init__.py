"""Workload "state" (``./dev bench state``): many tasks with two stores each (issue 34).

One instance of the runtime with one task per input partition (256 by
default, and 8) and two RocksDB stores per task, a count and a tumbling-window
count on the same stream; Kafka Streams on the same topology beside it. Peak
RSS, commit time per commit, time to open every store, restore time after the
local state is wiped, records/s on a backlog. ``main`` runs the session,
``runtime_side`` is the runtime's child process, ``ks_side`` starts the Kafka
Streams peer's JVM (``peers.StateBench``), ``workload`` holds the data and
the topology, ``report`` the markdown and the verdicts.
"""
