"""The cyclic garbage collector's settings for a process that runs an app.

Called once, by the main thread, right after `App.start()` returned, by what
owns the whole process: `streams-runtime run` (runtime.commands.run) and an
isolated query's child (runtime.isolation.child). An app embedded in someone
else's program leaves the GC to that program.

Why:

- `gc.freeze()`: what start-up made (modules, the topology, the app) lives
  as long as the process, so full collections stop scanning it. Each full
  collection scanned all of it holding the GIL, every thread stopped: 24-35 ms
  per collection in the queries benchmark's daemon (four in 60 s), none over
  5 ms once frozen.
- A young generation of 10,000 allocations instead of CPython's 700: every
  record allocates a few containers (the record, its value's dicts and
  lists, an output tuple) that die within the batch. Collected every 700
  allocations, those still alive in the middle of a batch are scanned and
  promoted, and the older generations then fill and are scanned too. The
  in-process microbenchmark (`python -m benchmarks.micro`, JSON map) spent
  0.46 us of 5.87 per record in the GC at 700, 0.11 at 10,000 (0 with the GC
  off). Memory cost: cyclic garbage waits for at most 10,000 more
  allocations; acyclic garbage is freed at once by reference counting, as
  before.
"""

from __future__ import annotations

import gc

YOUNG_GENERATION_THRESHOLD = 10_000


def tune_for_app_process() -> None:
    """Freeze start-up's objects and widen the young generation (see above)."""
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD, older, oldest)
