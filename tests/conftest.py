"""Shared pytest fixtures: one development broker per test session, hypothesis profiles.

Why one broker per session: starting Tansu is quick, but each test isolates itself with
unique topic and group names (``kafka_helpers.unique_name``) instead, which keeps the suite
fast. The broker starts lazily, only when a test asks for ``broker`` or ``bootstrap``, so
unit-only runs never spawn it. Fixtures run on pytest's main thread.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from runtime.devbroker import DevBroker

settings.register_profile("ci", deadline=None, max_examples=100)
settings.register_profile("dev", deadline=None, max_examples=25)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(scope="session")
def broker() -> Iterator[DevBroker]:
    """A running development broker on a free port, shared by the whole session."""
    dev_broker = DevBroker()
    dev_broker.start(timeout=60.0)
    try:
        yield dev_broker
    finally:
        dev_broker.stop()


@pytest.fixture(scope="session")
def bootstrap(broker: DevBroker) -> str:
    """``bootstrap.servers`` for the session's broker, e.g. ``127.0.0.1:40123``."""
    return broker.bootstrap
