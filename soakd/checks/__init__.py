"""Checks: answers checked while the load runs (docs/checks.md).

``builtin`` (the built-in kinds, their prompts, judges and the simulator's solver), ``expect``
(the user's JSONL checks), ``similarity`` (ROUGE-L of a reference check), ``verdict`` (the
bounded results), ``mix`` (which requests are checks; the runner's hook and the judging sink).
"""
