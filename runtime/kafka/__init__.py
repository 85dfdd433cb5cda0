"""Kafka itself, as the runtime meets it outside any one thread's loop.

Client configurations (what the shared consumer, producer, restore consumer
and admin client are built with, and which user overrides may not change),
topic checks and creation at start-up, cluster checks, serde checks on
sampled records, broker health (outage and coordinator-retry figures), and
closing a consumer on another thread.

Threads: the builders and checks run on the caller of `App.start` (or a CLI
command) before any runtime thread exists; `BrokerHealth` is written by the
polling thread and read racily by status; `consumer_release` closes a
consumer on a helper thread of its own.
"""
