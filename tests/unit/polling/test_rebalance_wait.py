"""Regular commits wait between a cooperative revocation and the next assignment."""

from __future__ import annotations

import time

from runtime.polling.rebalance_wait import WAIT_S, RebalanceCommitWait


def test_a_cooperative_revocation_holds_commits_until_the_next_assignment() -> None:
    wait = RebalanceCommitWait(cooperative=True, transaction_timeout_s=None)
    now = time.monotonic()
    assert not wait.holds(now)
    wait.revoked(2)
    assert wait.holds(time.monotonic())
    under_eos = RebalanceCommitWait(cooperative=True, transaction_timeout_s=60.0)
    under_eos.revoked(2)
    assert under_eos.holds(time.monotonic())
    wait.assigned()
    assert not wait.holds(time.monotonic())


def test_nothing_revoked_or_an_eager_protocol_holds_nothing() -> None:
    cooperative = RebalanceCommitWait(cooperative=True, transaction_timeout_s=None)
    cooperative.revoked(0)  # an empty revocation starts no second round
    assert not cooperative.holds(time.monotonic())
    eager = RebalanceCommitWait(cooperative=False, transaction_timeout_s=None)
    eager.revoked(4)  # eager: the assignment comes in the same round
    assert not eager.holds(time.monotonic())


def test_the_wait_is_bounded_by_its_limit_and_half_the_transaction_timeout() -> None:
    wait = RebalanceCommitWait(cooperative=True, transaction_timeout_s=10.0)
    wait.revoked(1)
    start = time.monotonic()
    assert wait.holds(start + 2.0) is True  # within min(WAIT_S, 5 s)
    assert wait.holds(start + 6.0) is False  # half the transaction timeout passed
    assert not wait.holds(start + 6.1)  # and it stays released until the next revocation
    wait = RebalanceCommitWait(cooperative=True, transaction_timeout_s=None)
    wait.revoked(1)
    start = time.monotonic()
    assert wait.holds(start + WAIT_S - 1)
    assert not wait.holds(start + WAIT_S + 1)
