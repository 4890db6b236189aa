"""Workload, sizing: synthetic prompts sized in a reference's tokens at start, checked
against the first answers, and planned against served prompt tokens per target.

One reference, so every target gets the same text (a fair A/B): ``workload.tokenizer``
when the config names one, else the first target (config order) whose /tokenize answers,
else the ``usage.prompt_tokens`` of the first answers (of the first target to answer with
usage). Each target's own count is measured and reported beside it. Whatever the start
measured is then checked against the answers' usage (the reference target's; any one's
with a local tokenizer): off by more than ``CHECK_TOLERANCE``, the prompts are corrected
from the next seq no target has used yet, and checked again (``CHECK_ROUNDS``). Every
calibration is a journal event (``prompt_calibration``); a resumed run rebuilds its
prompts from them and measures nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

import structlog

from soakd.config import Config
from soakd.journal.records import CalibrationStage, PromptCalibration, Unreadable
from soakd.model import Finished
from soakd.workload.calibration import (
    SCALE_MAX,
    SCALE_MIN,
    Calibration,
    LocalTokenizer,
    Source,
    TokenCounter,
    TokenizeError,
    costs_from_pieces,
)
from soakd.workload.datasets import source_lines
from soakd.workload.prompts import (
    WORDS,
    PromptSource,
    SyntheticPrompts,
    make_prompt_source,
)

log = structlog.get_logger()

START_PROMPTS: Final = 3
"""Prompts of the run (seq 0, 1, 2) each target counts at start, and the reference's
word-by-word costs are verified on."""
CHECK_ANSWERS: Final = 16
"""Answers with usage a check of the calibration reads (a ratio from 16 prompts of
word-salad is within about 1 % of the mean with the tests' tiny tokenizer)."""
CHECK_TOLERANCE: Final = 0.01
"""Served off the calibration's estimate by more than this share: corrected."""
CHECK_ROUNDS: Final = 3
"""Checks at most, each on the answers to the prompts the last correction sized: a ratio
learnt from usage cannot tell the chat template's tokens from the words', so a fixed length
needs a second round to land (docs/metrics.md, "Prompt tokens")."""
WARN_SHARE: Final = 0.10
"""Served off planned by more than this share: a warning line, and a note in the report."""
TOKENIZE_TIMEOUT_S: Final = 5.0
START_DEADLINE_S: Final = 30.0
"""The whole measurement at start; past it, the first answers' usage calibrates."""


def off_share(planned: float, served: float) -> float | None:
    """How far served is from planned, as a share of planned (None: nothing planned)."""
    return None if planned <= 0 else served / planned - 1.0


@dataclass
class StartMeasure:
    """What the measurement at start found."""

    calibration: Calibration | None  # None: nothing could count (the answers' usage will)
    planned: float  # mean planned tokens of the start prompts
    served: dict[str, float] = field(default_factory=dict)  # target -> its own mean count
    failed: dict[str, str] = field(default_factory=dict)  # target -> why it could not count
    requests: int = 0
    seconds: float = 0.0

    def event(self) -> PromptCalibration:
        """The journal's record of it."""
        return replace(
            carrying(CalibrationStage.START, self.calibration),
            planned=round(self.planned, 3),
            served={k: round(v, 3) for k, v in self.served.items()},
            failed=dict(self.failed),
            requests=self.requests,
            seconds=round(self.seconds, 3),
        )


def carrying(stage: CalibrationStage, cal: Calibration | None) -> PromptCalibration:
    """An event of the prompts' sizing with the calibration in use (None: none could be
    made), the rest of it to fill in."""
    if cal is None:
        return PromptCalibration(stage)
    return PromptCalibration(
        stage, cal.source, cal.reference, cal.costs, cal.scale, cal.overhead, cal.from_seq
    )


def calibration_of(e: PromptCalibration) -> Calibration:
    """The calibration an event carries; ValueError when prompts cannot be sized by it."""
    return Calibration.read(e.source, e.reference, e.costs, e.scale, e.overhead, e.from_seq)


async def measure_at_start(
    prompts: PromptSource,
    servers: Mapping[str, TokenCounter],
    *,
    local: TokenCounter | None = None,
    failed: Mapping[str, str] | None = None,
) -> StartMeasure:
    """Calibrate ``prompts`` (synthetic) against the reference, in place, and count the
    first prompts on every target in ``servers`` (config order) that can. ``failed``:
    targets that had no counter to begin with, and why. Never raises but CancelledError:
    a target that cannot count is named, and skipped."""
    t0 = time.monotonic()
    out = StartMeasure(None, _planned(prompts, range(START_PROMPTS)), failed=dict(failed or {}))
    try:
        async with asyncio.timeout(START_DEADLINE_S):
            await _measure(out, local, dict(servers), prompts)
    except TimeoutError:
        for name in servers:
            if name not in out.served:
                out.failed.setdefault(name, f"no answer within {START_DEADLINE_S:g} s")
    out.requests = sum(s.requests for s in servers.values())
    out.seconds = time.monotonic() - t0
    return out


async def _measure(
    out: StartMeasure,
    local: TokenCounter | None,
    servers: dict[str, TokenCounter],
    prompts: PromptSource,
) -> None:
    """Find who can count (concurrently), calibrate against the reference, then count the
    start prompts on each target."""

    async def probe(name: str, server: TokenCounter) -> None:
        try:
            await server.tokenize("the", as_sent=False)
        except TokenizeError as exc:
            out.failed[name] = str(exc)

    await asyncio.gather(*(probe(n, s) for n, s in servers.items()))
    able = {n: s for n, s in servers.items() if n not in out.failed}
    if isinstance(prompts, SyntheticPrompts):  # a prompt file is sent as it is: counted only
        await _calibrate_first(out, [local] if local is not None else list(able.values()), prompts)
        for name in out.failed:
            able.pop(name, None)
    seqs = range(START_PROMPTS)

    async def count(name: str, counter: TokenCounter) -> None:
        try:
            counts = [(await counter.tokenize(_text(prompts, s), as_sent=True)).count for s in seqs]
        except TokenizeError as exc:
            out.failed[name] = str(exc)
        else:
            out.served[name] = sum(counts) / len(counts)

    await asyncio.gather(*(count(n, s) for n, s in able.items()))


async def _calibrate_first(
    out: StartMeasure, candidates: Sequence[TokenCounter], prompts: SyntheticPrompts
) -> None:
    """Calibrate against the first candidate that counts to the end (the reference)."""
    for reference in candidates:
        try:
            cal = await calibrate(reference, prompts)
        except TokenizeError as exc:
            out.failed[reference.name] = str(exc)
            continue
        prompts.calibrate(cal)
        out.calibration = cal
        return


def _text(prompts: PromptSource, seq: int) -> str:
    return prompts.spec_fields(seq)[0]


def _planned(prompts: PromptSource, seqs: Sequence[int]) -> float:
    return sum(prompts.spec_fields(s)[1] for s in seqs) / max(1, len(seqs))


async def calibrate(counter: TokenCounter, prompts: SyntheticPrompts) -> Calibration:
    """Measure the reference, in five requests to a server. Each word's cost: its tokens
    in the whole word list, split where a token starts a word; else one ratio, the list's
    count over its words. What a request adds around the text (a chat template, a BOS):
    the run's first prompts as sent, less what their words cost. The word costs are kept
    when they predict those counts to within one constant (a few tokens: a template can
    spell the first word apart), else the ratio is."""
    source: Source = "tokenizer" if isinstance(counter, LocalTokenizer) else "tokenize"
    lead = await counter.tokenize("the", as_sent=False)
    vocab = await counter.tokenize("the " + " ".join(WORDS), as_sent=False)
    ratio = min(SCALE_MAX, max(SCALE_MIN, (vocab.count - lead.count) / len(WORDS)))
    costs = costs_from_pieces(vocab.pieces, 1 + len(WORDS)) if vocab.pieces else None
    if costs is not None and sum(costs) != vocab.count:
        costs = None
    trial = Calibration(source, counter.name, costs[1:] if costs else None, 1.0 if costs else ratio)
    built = SyntheticPrompts(prompts.lengths, prompts.seed, [trial])
    units, words, served = [], [], []
    for seq in range(START_PROMPTS):
        text, _, estimate = built.build(seq)
        units.append(estimate)
        words.append(len(text.split()))
        served.append((await counter.tokenize(text, as_sent=True)).count)
    around = [s - u for s, u in zip(served, units, strict=True)]
    if trial.costs is not None:
        if max(around) - min(around) <= 2 + 0.02 * sum(served) / len(served):
            return replace(trial, overhead=round(max(0.0, sum(around) / len(around)), 3))
        log.info(
            "prompt_word_costs_not_additive",
            reference=counter.name,
            served=served,
            estimated=[round(u, 1) for u in units],
        )
    around = [s - ratio * w for s, w in zip(served, words, strict=True)]
    return Calibration(
        source, counter.name, None, ratio, round(max(0.0, sum(around) / len(around)), 3)
    )


@dataclass(frozen=True)
class Stored:
    """What a run's journal says of its prompts' sizing (a resume reuses it)."""

    calibrations: list[Calibration]  # in seq order; empty: a word a token
    reference: str | None  # the target whose answers the check reads (None: any)
    measured: bool  # the start's measurement was made
    checks_left: int  # checks against the answers still to make


def stored(events: Iterable[PromptCalibration | Unreadable]) -> Stored:
    """The calibrations of a run's ``prompt_calibration`` events, in order. ValueError
    for one this soakd cannot read."""
    cals: list[Calibration] = []
    measured = False
    checks_left = CHECK_ROUNDS
    reference: str | None = None
    for e in events:
        if isinstance(e, Unreadable):  # stored data: a bad value, as a bad calibration is
            raise ValueError(f"a {e.kind} event this soakd cannot read")  # noqa: TRY004
        if e.stage is CalibrationStage.START:
            measured = True
            if e.source != "none":
                cal = calibration_of(e)
                cals.append(cal)
                reference = cal.reference if cal.source == "tokenize" else None
        elif e.stage is CalibrationStage.CHECK:
            checks_left -= 1
            if e.changed:
                cal = calibration_of(e)
                cals.append(cal)
                if cal.source in ("tokenize", "usage"):  # whose answers the checks read
                    reference = cal.reference or None
            else:
                checks_left = 0
    return Stored(cals, reference, measured, max(0, checks_left))


async def plan_lines(cfg: Config) -> list[str]:
    """What ``soakd check`` says of the prompts: their planned lengths and how they will be
    sized. With a local tokenizer the sizing is done here, as ``run`` will do it (a bad
    tokenizer file is a ConfigError); a target's /tokenize is asked at start only."""
    wl = cfg.workload
    prompts = make_prompt_source(wl)
    lines = source_lines(wl, prompts)
    if wl.calibrate == "off":
        return [*lines, "  sizing: off (workload.calibrate): a word a token, as planned"]
    names = ", ".join(t.name for t in cfg.targets)
    if wl.tokenizer is not None:
        local = LocalTokenizer(wl.tokenizer)
        m = await measure_at_start(prompts, {}, local=local)
        if m.calibration is not None:
            lines.append(f"  sizing: {m.calibration.describe()}")
        seqs = range(START_PROMPTS)
        counts = [(await local.tokenize(_text(prompts, q), as_sent=True)).count for q in seqs]
        lines.append(
            f"  planned {m.planned:g} -> {sum(counts) / len(counts):.1f} by this tokenizer "
            f"(seq 0-{START_PROMPTS - 1}; a chat template adds its own, corrected from "
            "the first answers)"
        )
    elif isinstance(prompts, SyntheticPrompts):
        lines.append(
            f"  sizing: at start, by the first target whose /tokenize answers ({names}); "
            "else by the first answers' usage"
        )
    if wl.conversations is not None:
        return [
            *lines,
            "  each target's own count: measured at start (a turn's context holds the "
            "answers served, so no seq's plan is checked against it)",
        ]
    lines.append(
        "  each target's own count: measured at start, then from its answers "
        "(a warning past 10 % off the plan)"
    )
    return lines


def log_start(m: StartMeasure, names: Sequence[str]) -> None:
    """One line for the calibration (or its fallback), one per target that counted, and a
    warning for each whose count is off the plan by more than WARN_SHARE."""
    cal = m.calibration
    if cal is None:
        log.warning(
            "prompt_calibration_fallback",
            reason=m.failed or "no target to ask",
            next="the first answers' usage.prompt_tokens sizes the prompts",
            requests=m.requests,
            seconds=round(m.seconds, 3),
        )
    else:
        log.info(
            "prompts_calibrated",
            calibration=cal.describe(),
            not_counted=m.failed or None,
            requests=m.requests,
            seconds=round(m.seconds, 3),
        )
    for name in names:
        served = m.served.get(name)
        if served is None:
            continue
        off = off_share(m.planned, served)
        fields = {"target": name, "planned": round(m.planned, 1), "served": round(served, 1)}
        if off is not None and abs(off) > WARN_SHARE:
            log.warning("prompt_tokens_off_plan", **fields, off_pct=round(off * 100, 1))
        else:
            log.info("prompt_tokens_at_start", **fields)


@dataclass(frozen=True, slots=True)
class PromptRow:
    """One target's prompt tokens: answers with usage, mean planned and mean served
    (this session; None: no answer yet), and its own count of the start prompts."""

    requests: int
    planned: float | None
    served: float | None
    at_start: float | None


@dataclass(frozen=True, slots=True)
class PromptTokens:
    """/status's ``prompt_tokens`` and the live view's line: how prompts are sized, the rows."""

    calibration: str | None
    checking: bool
    planned: float | None  # the start prompts' mean planned length (None: not measured)
    targets: Mapping[str, PromptRow]


def _no_seq() -> int:
    return 0


@dataclass
class _Tally:
    requests: int = 0
    planned: int = 0
    served: int = 0


def _add(t: _Tally, planned: int, served: int) -> None:
    t.requests += 1
    t.planned += planned
    t.served += served


class PromptLengths:
    """A sink: planned against served prompt tokens per target, from every answer that
    reports usage; the calibration's one check against the first answers; a warning per
    target whose served count is off the plan by more than WARN_SHARE (once, on the
    first CHECK_ANSWERS answers sized by the calibration in use)."""

    def __init__(
        self,
        prompts: PromptSource,
        names: Sequence[str],
        *,
        checks: int,
        reference: str | None = None,
        on_calibration: Callable[[PromptCalibration], None] | None = None,
        next_seq: Callable[[], int] = _no_seq,
        measured: StartMeasure | None = None,
        on_corrected: Callable[[Calibration], None] | None = None,
    ) -> None:
        self.prompts = prompts
        self.total = {name: _Tally() for name in names}
        self._recent = {name: _Tally() for name in names}  # since the calibration in use
        self._warned: set[str] = set()
        self._synthetic = prompts if isinstance(prompts, SyntheticPrompts) else None
        self.checks_left = checks if self._synthetic is not None else 0
        self.reference = reference
        self._samples: list[tuple[float, int]] = []  # this round's (estimated, served)
        self._units: list[float] = []  # every round's prompt units (Calibration.units)
        self._served: list[int] = []
        self._sample_target: str | None = reference
        self._on_calibration = on_calibration
        # told of each correction, after the prompts here took it: the senders' builders
        # take it too (soakd/workload/build.py)
        self._on_corrected = on_corrected
        # the next prompt seq no target has used: the runner's counter, shared with it
        # (soakd/run/assemble.py), read when a check corrects the calibration
        self.next_seq = next_seq
        self.at_start: dict[str, float] = {}  # target -> its own count of the start prompts
        self.planned_at_start: float | None = None  # their mean planned length
        if measured is not None:
            # what the start's measurement found: each target's own count, already said in
            # the log (no second warning for the same prompts)
            self.at_start = dict(measured.served)
            self.planned_at_start = round(measured.planned, 1)
            self._warned |= set(measured.served)

    @property
    def checking(self) -> bool:
        """The calibration is still to be checked against answers."""
        return self.checks_left > 0

    def record(self, o: Finished) -> None:
        served = o.prompt_tokens
        if o.error is not None or served is None or served <= 0 or o.conversation >= 0:
            return  # a conversation's turn is planned by its history, not by its seq
        seq = o.seq
        synthetic = self._synthetic
        planned = synthetic.length(seq) if synthetic else self.prompts.spec_fields(seq)[1]
        _add(self.total[o.target], planned, served)
        if synthetic is not None and seq < synthetic.calibration.from_seq:
            return  # sized by an earlier calibration: not the current prompts' figures
        _add(self._recent[o.target], planned, served)
        if self.checking and synthetic is not None:
            if self._sample_target is None:
                self._sample_target = o.target
            if o.target == self._sample_target:
                estimate = synthetic.estimate(seq)
                self._samples.append((estimate, served))
                self._units.append(synthetic.calibration.units(estimate))
                self._served.append(served)
                if len(self._samples) >= CHECK_ANSWERS:
                    self._check(synthetic)
        elif not self.checking and o.target not in self._warned:
            self._warn(o.target)

    def _check(self, prompts: SyntheticPrompts) -> None:
        """The calibration against the answers: corrected when off (and then checked
        again, CHECK_ROUNDS at most), else done."""
        self.checks_left -= 1
        estimated = sum(e for e, _ in self._samples)
        served = sum(s for _, s in self._samples)
        current = prompts.calibration
        off = served / estimated - 1.0 if estimated > 0 else 0.0
        new: Calibration | None = current
        if abs(off) > CHECK_TOLERANCE:
            new = current.corrected(self._units, self._served, self.next_seq())
            if new is not None:
                if current.source == "none":
                    new = replace(new, reference=self._sample_target or "")
                prompts.calibrate(new)
                if self._on_corrected is not None:
                    self._on_corrected(new)
                for tally in self._recent.values():
                    tally.requests = tally.planned = tally.served = 0
                self._warned.clear()  # new prompts: each target is looked at again
        fields = {
            "target": self._sample_target,
            "answers": len(self._samples),
            "estimated": round(estimated, 1),
            "served": served,
            "off_pct": round(off * 100, 2),
        }
        if new is None or new is current:
            self.checks_left = 0
        if new is None:
            log.warning("prompt_calibration_not_corrected", **fields, why="off beyond belief")
        elif new is current:
            log.info("prompt_calibration_checked", **fields)
        else:
            log.info(
                "prompt_calibration_corrected",
                **fields,
                from_seq=new.from_seq,
                calibration=new.describe(),
            )
        if self._on_calibration is not None:
            self._on_calibration(
                replace(
                    carrying(CalibrationStage.CHECK, new or current),
                    changed=new not in (None, current),
                    target=self._sample_target,
                    answers=len(self._samples),
                    estimated=round(estimated, 1),
                    served=served,
                    off_pct=round(off * 100, 2),
                )
            )
        self._samples = []

    def _warn(self, name: str) -> None:
        t = self._recent[name]
        if t.requests < CHECK_ANSWERS:
            return
        self._warned.add(name)
        off = off_share(t.planned, t.served)
        if off is not None and abs(off) > WARN_SHARE:
            log.warning(
                "prompt_tokens_off_plan",
                target=name,
                planned=round(t.planned / t.requests, 1),
                served=round(t.served / t.requests, 1),
                off_pct=round(off * 100, 1),
                answers=t.requests,
            )

    def rows(self) -> dict[str, PromptRow]:
        """Per target: answers with usage, mean planned and mean served prompt tokens
        (this session), and the target's own count of the start prompts."""
        return {
            name: PromptRow(
                t.requests,
                round(t.planned / t.requests, 1) if t.requests else None,
                round(t.served / t.requests, 1) if t.requests else None,
                round(self.at_start[name], 1) if name in self.at_start else None,
            )
            for name, t in self.total.items()
        }

    def status(self) -> PromptTokens:
        """/status's ``prompt_tokens``: how prompts are sized, and the rows."""
        synthetic = self._synthetic
        return PromptTokens(
            synthetic.calibration.describe() if synthetic else None,
            self.checking,
            self.planned_at_start,
            self.rows(),
        )
