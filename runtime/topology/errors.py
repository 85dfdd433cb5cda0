"""Errors of the topology package."""

from __future__ import annotations


class TopologyError(ValueError):
    """A mistake in how a topology was built, raised at build time.

    Examples: reading the same topic twice, two nodes with the same name, a
    non-callable predicate, a Processor instance where a supplier is expected.
    """
