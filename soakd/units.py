"""Units: the one clock's conversions, below everything (``soakd.model`` re-exports them)."""

from __future__ import annotations

from typing import Final

NS_PER_S: Final = 1_000_000_000
"""Nanoseconds in a second, an int: seconds -> ns (``round(s * NS_PER_S)``), ns -> s (``/``)."""
S_PER_NS: Final = 1e-9
"""Seconds in a nanosecond, a float: the hot path's ns -> s is one multiplication."""
