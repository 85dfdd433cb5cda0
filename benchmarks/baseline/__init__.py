"""The classic thread-per-client model, built from the runtime's own parts.

What the refactored runtime replaces: N stream threads in one process, each a
complete little Kafka Streams instance of its own, as Kafka Streams ran before
its state-updater / processing-thread redesign:

- its own main consumer (all in the same group, ``group.id = application.id``,
  so librdkafka spreads the input partitions across the N threads), its own
  producer and its own restore consumer: 3N clients, 3N broker connections;
- it polls, routes records into its own tasks' bounded input queues (the
  runtime's ``InputBuffers``: same bound, same pause/resume), processes its tasks
  inline, produces their output itself, and commits its own tasks every
  ``commit.interval.ms`` with the runtime's commit steps (emit state, produce,
  flush, ``commit_state``, checkpoint, commit offsets);
- it restores its stateful tasks inline before processing them: with
  ``restore_mode="blocking"`` (the default) it restores a task completely,
  doing nothing else meanwhile (no polling, no processing of its other tasks),
  as the oldest Kafka Streams did; ``"interleaved"`` restores one batch per loop
  iteration and processes its ready tasks in between (Kafka Streams 2.6-3.x).

Same code as the runtime wherever the threading model does not differ: the
topology (``Topology``/``Subtopology``), ``StreamTask`` built exactly as the
polling thread builds it (``StreamTask(subtopology, partition, topics,
TaskSettings(...))``), the state stores, checkpoints, client configs
(``runtime.kafka.clients``), topic resolution (``resolve_topics``) and
``StreamsConfig``. Differences that belong to the model: partitions are placed
by the consumer group (N members) instead of one member; the cache budget
(``cache.max.bytes``) is split evenly over the threads, as Kafka Streams splits
its cache; no status topic (the runtime's standby-placement channel) is used.

Only ``at_least_once`` is implemented. This is benchmark code, not a product:
a failing thread stops itself and reports ``failure``; there is no thread
replacement, no standby tasks and no exactly-once.
"""

from benchmarks.baseline.app import BaselineApp
from benchmarks.baseline.stream_thread import StreamThread

__all__ = ["BaselineApp", "StreamThread"]
