"""Breakdown room: the one home of the keys latency is broken down by, besides target and
phase. Pure: no IO.

- **Context length**: a request's served prompt tokens (the server's
  ``usage.prompt_tokens``: the context the KV cache held when the first token came, a
  conversation's history included), in buckets whose upper bounds are powers of two
  from 128 to 131,072 tokens (``CONTEXT_BOUNDS``), then ``+Inf``. A request whose served
  count is unknown (no usage) is in no bucket: the planned length is not the context the
  server held, and a guess would bend the curve.
- **Turn**: a conversation's turn, from 0; turns from ``TURN_CAP`` on fold into one
  ``"16+"`` key. A single request (no conversation) has no turn.

The ``/metrics`` labels (soakd/metrics/run.py), the report's tables (soakd/report/
breakdowns.py) and the dashboards use these keys, so their series and rows line up, and
their count is bounded by construction (12 context buckets, 17 turns).
"""

from __future__ import annotations

import bisect
from typing import Final

CONTEXT_BOUNDS: Final = tuple(2**k for k in range(7, 18))
"""Upper bounds (inclusive) of the context-length buckets, in served prompt tokens:
128, 256, ... 131,072; past the last, ``+Inf``."""
CONTEXT_LABELS: Final = (*(str(b) for b in CONTEXT_BOUNDS), "+Inf")
"""Each bucket's key (its upper bound), in order: the ``context`` label's values."""
TURN_CAP: Final = 16
"""Turns from this one on share one key (``"16+"``)."""
TURN_LABELS: Final = (*(str(t) for t in range(TURN_CAP)), f"{TURN_CAP}+")
"""Every turn key, in order: the ``turn`` label's values."""


def context_of(prompt_tokens: int | None) -> str | None:
    """The bucket of a served prompt length (None: unknown, or no prompt counted)."""
    if prompt_tokens is None or prompt_tokens <= 0:
        return None
    return CONTEXT_LABELS[bisect.bisect_left(CONTEXT_BOUNDS, prompt_tokens)]


def turn_key(turn: int) -> str:
    """The key of a conversation's turn (from 0)."""
    return TURN_LABELS[min(max(turn, 0), TURN_CAP)]


def turn_of(conversation: int | None, turn: int | None) -> str | None:
    """The turn key of a request (None: not a turn of a conversation)."""
    if conversation is None or conversation < 0:
        return None
    return turn_key(turn or 0)


def context_title(label: str) -> str:
    """A bucket as a table shows it: "≤ 4,096 tokens", "> 131,072 tokens"."""
    if label == "+Inf":
        return f"> {CONTEXT_BOUNDS[-1]:,}"
    return f"≤ {int(label):,}"
