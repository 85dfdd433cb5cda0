"""Regular commits wait while a cooperative rebalance is between its rounds.

With cooperative-sticky assignment a member that gave up partitions rejoins
at once for the round that hands them to their new owner. The group moves
to its next generation as soon as every member rejoined, possibly before the
polling thread serves its own new assignment; an offset commit sent
meanwhile carries the old generation and is refused (ILLEGAL_GENERATION).
Under exactly_once_v2 that aborts the transaction and rewinds every task of
the process, so the work since the last commit is done twice (seen at each
start of a second process of one daemon). Kafka Streams skips commits while
a rebalance is in progress for the same reason; so does this runtime,
between a served revocation and the next served assignment.

The wait is bounded: a round that does not come within `WAIT_S` (or half
the transaction timeout) lets commits go on as before. Commits that close
tasks (revocation, shutdown) do not wait: they are not regular commits.

Only the polling thread calls this.
"""

from __future__ import annotations

import time

from runtime.logging import get_logger

log = get_logger("runtime.polling")

# At most this long without a regular commit after a cooperative revocation.
WAIT_S = 10.0


class RebalanceCommitWait:
    """Whether a regular commit waits for the rebalance's next round."""

    def __init__(self, cooperative: bool, transaction_timeout_s: float | None) -> None:
        """`transaction_timeout_s`: the producer's (exactly_once_v2), else None."""
        self._cooperative = cooperative
        self._limit_s = (
            WAIT_S if transaction_timeout_s is None else min(WAIT_S, transaction_timeout_s / 2)
        )
        self._since: float | None = None

    def revoked(self, partitions: int) -> None:
        """A revocation was served: a cooperative one is followed by a round."""
        if self._cooperative and partitions:
            self._since = time.monotonic()

    def assigned(self) -> None:
        """An assignment was served: the rebalance is complete."""
        self._since = None

    def holds(self, now: float) -> bool:
        """True while a regular commit should wait (bounded, module docstring)."""
        since = self._since
        if since is None:
            return False
        if now - since < self._limit_s:
            return True
        self._since = None
        log.info("rebalance_commit_wait_ended", waited_s=round(now - since, 1))
        return False
