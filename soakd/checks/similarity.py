"""Checks room, similarity: a reference check's answer against the kept one (ROUGE-L F1,
Google's ``rouge-score``; the scorer built once). The library, and the nltk and numpy it
brings, are imported at the first reference check: a run without one never loads them
(43 MB of RSS and about 0.4 s at every start, measured)."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rouge_score import rouge_scorer


@cache
def _scorer() -> rouge_scorer.RougeScorer:
    from rouge_score import rouge_scorer  # lazily: see the module's doc

    return rouge_scorer.RougeScorer(["rougeL"])


def rouge_l(reference: str, answer: str) -> float:
    """ROUGE-L F1 of ``answer`` against ``reference``, 0..1 (1: the same words in order)."""
    if not reference.strip() and not answer.strip():
        return 1.0
    return float(_scorer().score(reference, answer)["rougeL"].fmeasure)
