"""Config room, checks: answers checked while the load runs (docs/checks.md).

A share of each target's requests (``share``) or one every ``every`` seconds are checks:
a prompt whose answer soakd can judge, sent on the same path at temperature 0. The kinds
are built in (``kinds``), the user's own (``file``: JSONL, each line with an ``expect``), or
``reference`` prompts whose later answers are scored against the first ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from soakd.config.base import PositiveDuration, Strict

BuiltinKind = Literal["number_words", "arithmetic", "echo"]
"""The built-in checks (soakd/checks/builtin.py): answers soakd computes itself."""
BUILTIN_KINDS: tuple[BuiltinKind, ...] = ("number_words", "arithmetic", "echo")


def _share(value: Any) -> Any:
    """``"1%"`` -> 0.01; a bare number is a fraction (0.01)."""
    share = value
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            share = float(value.strip()[:-1]) / 100
        except ValueError:
            raise ValueError(f"bad percentage {value!r}") from None
    if isinstance(share, int | float) and not isinstance(share, bool) and share > 1:
        raise ValueError(f"a share is at most 100 % (1), got {value!r}")
    return share


Share = Annotated[
    float,
    BeforeValidator(_share),
    Field(gt=0, le=1, allow_inf_nan=False, description="0 < share <= 100 %"),
]


def _all_kinds() -> list[BuiltinKind]:
    return list(BUILTIN_KINDS)


class Reference(Strict):
    """Prompts whose first answers are kept; later answers are scored against them
    (ROUGE-L F1) and fail below ``threshold``."""

    prompts: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    # whose first answers are the reference: each target's own (None), or one target's
    target: str | None = None
    metric: Literal["rouge_l"] = "rouge_l"
    threshold: Annotated[float, Field(ge=0, le=1)] = 0.5  # a score below it fails
    max_tokens: Annotated[int, Field(ge=1, le=4096)] = 64


class ChecksConfig(Strict):
    """Checks mixed into the load (docs/checks.md): requests whose answers soakd judges,
    sent at temperature 0 on the same path and load shape. Exactly one of ``share`` and
    ``every``."""

    share: Share | None = None  # this share of each target's requests are checks: 1% or 0.01
    every: PositiveDuration | None = None  # or one check every this long per target (30s)
    # the built-in checks mixed in (an empty list: only the file's and reference's)
    kinds: list[BuiltinKind] = Field(default_factory=_all_kinds)
    file: Path | None = None  # JSONL of the user's own checks (soakd/checks/expect.py)
    reference: Reference | None = None
    max_tokens: Annotated[int, Field(ge=1, le=4096)] = 32  # a built-in or file check's cap
    seed: int = 0  # which requests are checks, and which check each is

    @model_validator(mode="after")
    def _one_rate(self) -> ChecksConfig:
        if (self.share is None) == (self.every is None):
            raise ValueError("set exactly one of share (e.g. 1%) and every (e.g. 30s)")
        if not self.kinds and self.file is None and self.reference is None:
            raise ValueError("no checks: name kinds, a file or reference prompts")
        return self
