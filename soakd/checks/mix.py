"""Checks room, the mix: which requests are checks, what they ask, and how they are judged.

The runner asks ``Checks.spec`` to look at every request it plans (one multiplication and
a compare for a request that is no check); a check's spec carries its own prompt, at
temperature 0 and with its answer kept, on the same target, path and load shape. Its
outcome comes back through ``record`` (a sink, in soakd's process, after the journal), is
judged, and the ``Judged`` goes to ``emit`` (the journal's event, the metrics, the log).
Which seq is a check, and which check it is, follow from ``checks.seed`` and the seq:
every target gets the same checks at the same seqs (``share``), a fair A/B.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from soakd.checks import builtin
from soakd.checks.expect import Expected, read_checks
from soakd.checks.identity import Identities
from soakd.checks.similarity import rouge_l
from soakd.checks.verdict import FAIL, PASS, UNPARSEABLE, Verdict
from soakd.config import ChecksConfig
from soakd.model import Finished, RequestSpec

ANSWER_SHOWN: Final = 80
"""Characters of a failing answer kept (journal event, report): enough to see what went
wrong, never the whole answer."""
PENDING_MAX: Final = 65_536
"""Checks sent and not yet judged, per run at most (one never sent is forgotten here)."""
_GOLDEN: Final = 0x9E3779B97F4A7C15
_MASK: Final = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Judged:
    """One check's verdict, as journaled and exported."""

    target: str
    phase: str
    seq: int
    check: str  # a built-in kind, "file" or "reference"
    result: str  # soakd/checks/verdict.py RESULTS
    score: float | None  # a reference check's similarity
    answer: str  # a failing answer's first ANSWER_SHOWN characters; "" when it passed


@dataclass(frozen=True, slots=True)
class _Pending:
    check: str
    expected: str  # a built-in's answer; a reference's index as text
    item: Expected | None = None


class Checks:
    """Checks mixed into the load (``checks:``): the runner's spec hook and a sink."""

    def __init__(
        self,
        cfg: ChecksConfig,
        emit: Callable[[Judged], None],
        identities: Identities | None = None,
    ) -> None:
        self._cfg = cfg
        self._emit = emit
        self._identities = identities  # the kept answers' model and fingerprint, watched
        self._file = read_checks(cfg.file) if cfg.file is not None else []
        self._sources: list[str] = [*cfg.kinds]
        if self._file:
            self._sources.append("file")
        if cfg.reference is not None:
            self._sources.append("reference")
        self._below = int(cfg.share * (1 << 64)) if cfg.share is not None else 0
        self._every_ns = int(cfg.every * 1e9) if cfg.every is not None else 0
        self._next_ns: dict[str, int] = {}  # every: each target's next check instant
        self._pending: dict[tuple[str, int], _Pending] = {}
        self._kept: dict[tuple[str, int], str] = {}  # reference: (whose, index) -> answer
        self.sent: dict[str, int] = {}  # checks planned, per target

    def is_check(self, target: str, seq: int, scheduled_ns: int) -> bool:
        if self._below:
            return ((seq + self._cfg.seed + 1) * _GOLDEN) & _MASK < self._below
        due = self._next_ns.get(target, 0)
        if scheduled_ns < due:
            return False
        self._next_ns[target] = scheduled_ns + self._every_ns
        return True

    def spec(self, spec: RequestSpec) -> RequestSpec:
        """``spec`` itself, or the check sent in its place."""
        if not self.is_check(spec.target, spec.seq, spec.scheduled_ns):
            return spec
        rng = random.Random(self._cfg.seed * 1_000_003 + spec.seq)
        source = rng.choice(self._sources)
        max_tokens = self._cfg.max_tokens
        if source == "file":
            item = rng.choice(self._file)
            prompt, pending = item.prompt, _Pending("file", "", item)
        elif source == "reference":
            ref = self._cfg.reference
            assert ref is not None
            index = rng.randrange(len(ref.prompts))
            prompt, pending = ref.prompts[index], _Pending("reference", str(index))
            max_tokens = ref.max_tokens
        else:
            prompt, expected = builtin.make(source, rng)
            pending = _Pending(source, expected)
        if len(self._pending) >= PENDING_MAX:
            del self._pending[next(iter(self._pending))]
        self._pending[spec.target, spec.seq] = pending
        self.sent[spec.target] = self.sent.get(spec.target, 0) + 1
        return dataclasses.replace(
            spec,
            prompt=prompt,
            prompt_tokens_hint=len(prompt.split()),
            max_tokens=max_tokens,
            temperature=0.0,
            output_planned=False,
            keep_answer=True,
        )

    def record(self, outcome: Finished) -> None:
        """A sink: judge the outcome when it was a check's. A failed request is not
        judged (its failure is counted as the request's)."""
        identity = outcome.identity
        if identity is not None and self._identities is not None and outcome.ok:
            self._identities.seen(outcome.target, identity)
        pending = self._pending.pop((outcome.target, outcome.seq), None)
        if pending is None or not outcome.ok or outcome.answer is None:
            return
        answer = outcome.answer
        verdict = self._judge(outcome.target, pending, answer)
        if verdict is None:
            return
        shown = "" if verdict.result == PASS else answer[:ANSWER_SHOWN]
        self._emit(
            Judged(
                outcome.target,
                outcome.phase,
                outcome.seq,
                pending.check,
                verdict.result,
                verdict.score,
                shown,
            )
        )

    def _judge(self, target: str, pending: _Pending, answer: str) -> Verdict | None:
        if pending.item is not None:
            return pending.item.judge(answer)
        if pending.check != "reference":
            return builtin.judge(pending.check, pending.expected, answer)
        ref = self._cfg.reference
        assert ref is not None
        whose = ref.target or target
        key = (whose, int(pending.expected))
        kept = self._kept.get(key)
        if kept is None:  # the first answer is the reference: kept, not judged
            if whose == target and answer.strip():
                self._kept[key] = answer
            return None
        if not answer.strip():
            return Verdict(UNPARSEABLE)
        score = rouge_l(kept, answer)
        return Verdict(PASS if score >= ref.threshold else FAIL, round(score, 4))


def describe_checks(cfg: ChecksConfig) -> str:
    """``checks: 5 % of each target's requests: number_words, ... (soakd check)."""
    rate = f"{cfg.share * 100:g} % of" if cfg.share is not None else f"one every {cfg.every:g} s of"
    kinds: list[str] = [*cfg.kinds]
    if cfg.file is not None:
        kinds.append(f"{cfg.file} ({len(read_checks(cfg.file))} checks)")
    if cfg.reference is not None:
        ref = cfg.reference
        whose = f"{ref.target}'s" if ref.target else "each target's own"
        kinds.append(
            f"reference ({len(ref.prompts)} prompts against {whose} first answers, "
            f"ROUGE-L below {ref.threshold:g} fails)"
        )
    return f"checks: {rate} each target's requests, at temperature 0: {', '.join(kinds)}"
