"""Polling thread: the one shared consumer and producer, rebalances, commits.

Only the polling thread touches the main consumer and the producer. It routes
records into task input buffers, drains the record collector, creates and
closes tasks in rebalance callbacks, runs the commit protocol and follows
partition expansions (`expansion`). Topic checks at start-up
(`topics.resolve_topics`) run on the caller of App.start.
"""
