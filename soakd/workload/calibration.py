"""Workload, calibration: what one prompt word costs in a server's tokens.

soakd's synthetic prompts are words; a server counts tokens, and how many a word costs is
its tokenizer's business (every word of the list is one token in Llama 3 or Qwen, one to
six in the tests' tiny tokenizer). A ``Calibration`` says what the reference counted:
each word's cost (measured word by word, or one ratio for all), and the tokens a request
adds around the text (a chat template, a BOS). The prompt generator sizes prompts by it
(``prompts.py``); ``sizing.py`` measures it. Pure but for ``LocalTokenizer``, which reads
its file once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, Literal, Protocol, TypeGuard, get_args

from soakd.config import ConfigError

Source = Literal["none", "tokenizer", "tokenize", "usage"]

SCALE_MIN: Final = 0.125
SCALE_MAX: Final = 8.0
"""The ratios a calibration may apply: beyond them a count is not believed (a server whose
usage is a constant, a tokenizer that is not the model's), and the prompts stay as they are."""

_SPACE_MARKS = (" ", "\u2581", "\u0120")  # a space; sentencepiece's ▁; byte-level BPE's Ġ


@dataclass(frozen=True, slots=True)
class Calibration:
    """How the reference counts a prompt of soakd's words, from seq ``from_seq`` on.

    A word's cost is ``costs[i] * scale`` (``costs`` None: 1 each); a request adds
    ``overhead`` tokens around the text. The default is the plan's own assumption: one
    token a word, nothing around it."""

    source: Source = "none"
    reference: str = ""  # the tokenizer file or the target that counted
    costs: tuple[int, ...] | None = None  # per word of prompts.WORDS, measured
    scale: float = 1.0
    overhead: float = 0.0
    from_seq: int = 0

    def word_costs(self, n_words: int) -> list[float]:
        """Each word's cost, in the order of prompts.WORDS."""
        if self.costs is None:
            return [self.scale] * n_words
        return [c * self.scale for c in self.costs]

    def describe(self) -> str:
        """One line: where it came from and what it says."""
        if self.source == "none":
            return "one token a word (not calibrated)"
        per_word = (
            f"{sum(self.costs) / len(self.costs) * self.scale:.3f} tokens a word, word by word"
            if self.costs
            else f"{self.scale:.3f} tokens a word (a ratio)"
        )
        if self.source == "tokenizer":
            whose = f"tokenizer {self.reference}"
        elif self.source == "tokenize":
            whose = f"{self.reference}'s /tokenize"
        else:
            whose = f"{self.reference or 'the first'} answers' usage"
        return f"{whose}: {per_word}, {self.overhead:g} around the text"

    @classmethod
    def read(
        cls,
        source: str,
        reference: str,
        costs: Sequence[int] | None,
        scale: float,
        overhead: float,
        from_seq: int,
    ) -> Calibration:
        """A calibration as the journal stored it (event ``prompt_calibration``: a resume,
        the report). ValueError when it is not one prompts can be sized by."""
        if not _is_source(source):
            raise ValueError(f"unknown calibration source {source!r}")
        if costs is not None and not all(type(c) is int and c >= 1 for c in costs):
            raise ValueError("calibration costs must be a list of counts")
        if not _number(scale) or not SCALE_MIN <= scale <= SCALE_MAX:
            raise ValueError(f"calibration scale {scale!r} is out of range")
        if not _number(overhead) or overhead < 0:
            raise ValueError(f"calibration overhead {overhead!r} is not a count")
        if type(from_seq) is not int or from_seq < 0:
            raise ValueError(f"calibration from_seq {from_seq!r} is not a seq")
        return cls(
            source,
            reference,
            tuple(costs) if costs is not None else None,
            float(scale),
            float(overhead),
            from_seq,
        )

    def units(self, estimate: float) -> float:
        """A prompt's cost before scale and overhead, from this calibration's estimate of
        it: the same for a text whatever scale and overhead later corrections give."""
        return (estimate - self.overhead) / self.scale

    def corrected(
        self, units: Sequence[float], served: Sequence[int], from_seq: int
    ) -> Calibration | None:
        """This calibration made to agree with a server's usage: ``served`` tokens for
        prompts of these ``units`` (``units()``), the answers of one target. Costs measured
        word by word keep their scale, and the difference goes to the overhead (a chat
        template a tokenizer.json cannot see). A ratio is refitted: a least-squares line
        (its slope the scale, its intercept the overhead) once the prompts differ in length
        by a fifth, as they do after a first correction of a fixed length; until then the
        one ratio, over the overhead already known. None: beyond belief."""
        n = len(units)
        if n == 0 or len(served) != n or min(served) <= 0 or min(units) <= 0:
            return None
        if self.costs is not None and self.source in ("tokenizer", "tokenize"):
            overhead = (sum(served) - self.scale * sum(units)) / n
            if overhead < 0 or overhead > max(served):
                return None
            return replace(self, overhead=round(overhead, 3), from_seq=from_seq)
        mean_u, mean_s = sum(units) / n, sum(served) / n
        spread = sum((u - mean_u) ** 2 for u in units)
        scale, overhead = 0.0, -1.0
        if max(units) - min(units) > 0.2 * mean_u and spread > 0:
            scale = sum((u - mean_u) * (s - mean_s) for u, s in zip(units, served, strict=True))
            scale /= spread
            overhead = mean_s - scale * mean_u
        if overhead < 0:  # one length, or a line through negative tokens: one ratio
            overhead = min(self.overhead, mean_s / 2)
            scale = (mean_s - overhead) / mean_u
        if not SCALE_MIN <= scale <= SCALE_MAX:
            return None
        return replace(
            self,
            source="usage" if self.source == "none" else self.source,
            scale=round(scale, 6),
            overhead=round(overhead, 3),
            from_seq=from_seq,
        )


UNCALIBRATED: Final = Calibration()


def _is_source(value: str) -> TypeGuard[Source]:
    return value in get_args(Source)


def _number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def costs_from_pieces(pieces: list[str], n_words: int) -> tuple[int, ...] | None:
    """Each word's token count, from the token strings of the words joined by spaces.

    A token that begins a word carries the space (``▁word``, ``Ġword``, `` word``); the
    tokens up to the next such one are that word's. None when the tokens do not fall into
    ``n_words`` words that way (a tokenizer that marks words otherwise)."""
    costs: list[int] = []
    for i, piece in enumerate(pieces):
        if i == 0 or piece.startswith(_SPACE_MARKS):
            costs.append(1)
        else:
            costs[-1] += 1
    return tuple(costs) if len(costs) == n_words else None


@dataclass(frozen=True, slots=True)
class Tokenized:
    """A count, and the token strings when the counter gave them."""

    count: int
    pieces: list[str] | None = None


class TokenizeError(Exception):
    """A counter could not count (no /tokenize, an answer of the wrong shape...): short,
    secret-free, one log line's worth."""


class TokenCounter(Protocol):
    """Something that counts tokens as a server would: a target's /tokenize, a local file."""

    name: str
    requests: int  # asked of a server so far (the cost of calibrating)

    async def tokenize(self, text: str, *, as_sent: bool) -> Tokenized:
        """``as_sent``: the prompt as a request carries it (the chat template or the BOS the
        server adds); else the text alone, with the token strings when available.
        Raises TokenizeError."""
        ...


class LocalTokenizer:
    """A ``tokenizer.json`` read with the ``tokenizers`` package (no hub access). It knows
    the special tokens its post-processor adds, not a chat template: the first answers'
    usage adds those tokens (``Calibration.corrected``)."""

    def __init__(self, path: Path) -> None:
        where = "workload.tokenizer"
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ConfigError(
                f"{where}: the tokenizers package is not installed (pip install 'soakd[tokenizer]')"
            ) from None
        try:
            data = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
            raise ConfigError(f"{where}: cannot read {path}: {why}") from None
        try:
            self._tok = Tokenizer.from_str(data)
        except Exception as exc:  # the Rust side raises plain Exception
            first = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
            raise ConfigError(f"{where}: {path} is not a tokenizer.json ({first})") from None
        self.name = str(path)
        self.path = path
        self.requests = 0  # never asks a server

    def count(self, text: str, *, as_sent: bool) -> Tokenized:
        enc = self._tok.encode(text, add_special_tokens=as_sent)
        return Tokenized(len(enc.ids), None if as_sent else list(enc.tokens))

    async def tokenize(self, text: str, *, as_sent: bool) -> Tokenized:
        return self.count(text, as_sent=as_sent)
