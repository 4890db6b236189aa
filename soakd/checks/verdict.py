"""Checks room, verdict: what a judged answer became (pure, the bounded results)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

PASS: Final = "pass"  # noqa: S105  (a result, not a password)
FAIL: Final = "fail"
UNPARSEABLE: Final = "unparseable"
RESULTS: Final = (PASS, FAIL, UNPARSEABLE)
"""A check's results: bounded, safe as a metric label."""


@dataclass(frozen=True, slots=True)
class Verdict:
    result: str  # one of RESULTS
    score: float | None = None  # a reference check's similarity, 0..1
