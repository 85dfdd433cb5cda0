"""Tasks, the task manager/scheduler and the processing thread pool.

Processing threads lock one task at a time through the task manager, process
its buffered records and release it; they never call a Kafka client. The
polling thread adds/removes tasks and locks all of them for commits. In
key-parallel mode (`key_parallel.py`, `key_lanes.py`) several threads share a
task, each holding different keys. Both kinds process a record through the
one path in `record_context.py`.
"""
