"""`KGroupedStream.windowed_by` for the windows other than `TimeWindows`.

A separate module so that `grouped.py` needs only one lazy import for the
session and sliding window DSLs (which import `grouped.py`'s types).

Used by the thread that defines the application, like the rest of the DSL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runtime.topology.errors import TopologyError
from runtime.topology.session_windows import SessionWindows

if TYPE_CHECKING:
    from runtime.topology.grouped import KGroupedStream


def other_windowed_by(grouped: KGroupedStream, windows: Any) -> Any:
    """The windowed stream for `windows`, or a TopologyError naming what is accepted."""
    if isinstance(windows, SessionWindows):
        from runtime.topology.session_dsl import SessionWindowedKStream

        return SessionWindowedKStream(grouped, windows)
    raise TopologyError(
        f"windowed_by() expects TimeWindows, SessionWindows or SlidingWindows, got {windows!r}"
    )
