"""Small topologies that the daemon tests run with `streams-runtime run tests.apps.MODULE:ATTR`.

Topic names come from environment variables (`STREAMS_TEST_INPUT`, `STREAMS_TEST_OUTPUT`),
so each test can point a daemon at its own uniquely named topics.
"""
