"""Checks room, similarity: a reference check's answer against the kept one (ROUGE-L F1,
Google's ``rouge-score``; the scorer built once)."""

from __future__ import annotations

from functools import cache

from rouge_score import rouge_scorer


@cache
def _scorer() -> rouge_scorer.RougeScorer:
    return rouge_scorer.RougeScorer(["rougeL"])


def rouge_l(reference: str, answer: str) -> float:
    """ROUGE-L F1 of ``answer`` against ``reference``, 0..1 (1: the same words in order)."""
    if not reference.strip() and not answer.strip():
        return 1.0
    return float(_scorer().score(reference, answer)["rougeL"].fmeasure)
