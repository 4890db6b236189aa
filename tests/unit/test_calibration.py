"""Prompt calibration: prompts sized in a tokenizer's own tokens, word by word or by a ratio,
checked against the answers' usage, stored and read back; no network (a real tokenizer.json
trained here with the tokenizers package)."""

from __future__ import annotations

import asyncio
import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from soakd.config import ConfigError, TokenLength
from soakd.journal.records import CalibrationStage, PromptCalibration, read_as
from soakd.model import ErrorKind, Outcome
from soakd.workload.calibration import (
    SCALE_MAX,
    UNCALIBRATED,
    Calibration,
    LocalTokenizer,
    Tokenized,
    costs_from_pieces,
)
from soakd.workload.prompts import WORDS, SyntheticPrompts
from soakd.workload.sizing import (
    CHECK_ANSWERS,
    CHECK_ROUNDS,
    PromptLengths,
    PromptRow,
    calibrate,
    calibration_of,
    carrying,
    measure_at_start,
    stored,
)
from tests.tiny_tokenizer import KINDS, train

pytest.importorskip("tokenizers", reason="pip install -e '.[test]'")

START, CHECK = CalibrationStage.START, CalibrationStage.CHECK
FIXED_300 = TokenLength(dist="fixed", mean=300)
SPREAD = TokenLength(dist="uniform", min=16, max=1200)


@pytest.fixture(scope="module", params=KINDS)
def tokenizer_file(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return train(tmp_path_factory.mktemp("tok"), str(request.param))


def counts(tok: LocalTokenizer, prompts: SyntheticPrompts, seqs: range) -> list[tuple[int, int]]:
    """(planned, the tokenizer's count as sent) for each seq."""
    out = []
    for seq in seqs:
        text, planned = prompts.spec_fields(seq)
        out.append((planned, tok.count(text, as_sent=True).count))
    return out


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- sizing by a local tokenizer ------------------------------------------------------------


def test_uncalibrated_prompts_are_a_word_a_token_and_far_off_for_this_tokenizer(
    tokenizer_file: Path,
) -> None:
    tok = LocalTokenizer(tokenizer_file)
    prompts = SyntheticPrompts(FIXED_300)
    pairs = counts(tok, prompts, range(50))
    assert all(len(prompts.spec_fields(s)[0].split()) == 300 for s in range(50))
    served = statistics.mean(c for _, c in pairs)
    assert served > 1.5 * 300  # the plan's 300 is not what this tokenizer counts


@pytest.mark.parametrize("lengths", [FIXED_300, SPREAD], ids=["fixed-300", "uniform"])
def test_word_by_word_calibration_sizes_every_prompt_to_its_planned_tokens(
    tokenizer_file: Path, lengths: TokenLength
) -> None:
    tok = LocalTokenizer(tokenizer_file)
    prompts = SyntheticPrompts(lengths, seed=3)
    measure = run(measure_at_start(prompts, {}, local=tok))
    cal = measure.calibration
    assert cal is not None
    assert cal.source == "tokenizer"
    assert cal.costs is not None  # measured word by word
    # the BOS, and a byte-level first word spelled without its space
    assert 1 <= cal.overhead <= 2
    assert measure.requests == 0
    longest_word = max(cal.costs)
    for planned, served in counts(tok, prompts, range(300)):
        # the nearest a window of whole words can come, the BOS included
        assert abs(served - planned) <= longest_word / 2 + 1, (planned, served)
    pairs = counts(tok, prompts, range(300))
    planned_sum = sum(p for p, _ in pairs)
    assert abs(sum(s for _, s in pairs) / planned_sum - 1) < 0.005


def test_the_same_calibration_gives_the_same_prompts_and_others_stay(tokenizer_file: Path) -> None:
    tok = LocalTokenizer(tokenizer_file)
    a = SyntheticPrompts(FIXED_300, seed=9)
    cal = run(calibrate(tok, a))
    a.calibrate(cal)
    b = SyntheticPrompts(FIXED_300, 9, stored([journaled(carrying(START, cal))]).calibrations)
    assert [a.spec_fields(s) for s in range(200)] == [b.spec_fields(s) for s in range(200)]
    plain = SyntheticPrompts(FIXED_300, seed=9)
    assert a.spec_fields(5) != plain.spec_fields(5)
    assert a.spec_fields(5)[1] == plain.spec_fields(5)[1] == 300  # the plan is the plan


def test_a_tokenizer_without_word_marks_falls_back_to_a_ratio(tokenizer_file: Path) -> None:
    """Token strings that do not split into words (another marking, or none): one ratio
    for every word, right on the mean (a window's words vary around it)."""
    tok = LocalTokenizer(tokenizer_file)

    class NoPieces:
        name = "no-pieces"
        requests = 0

        async def tokenize(self, text: str, *, as_sent: bool) -> Tokenized:
            return Tokenized(tok.count(text, as_sent=as_sent).count, None)

    prompts = SyntheticPrompts(FIXED_300, seed=1)
    cal = run(calibrate(NoPieces(), prompts))
    assert cal.costs is None
    assert cal.scale > 1.5
    prompts.calibrate(cal)
    pairs = counts(tok, prompts, range(400))
    mean = statistics.mean(s for _, s in pairs)
    assert abs(mean / 300 - 1) < 0.02
    assert all(abs(s / 300 - 1) < 0.2 for _, s in pairs)


def test_word_costs_that_do_not_add_up_fall_back_to_a_ratio(tokenizer_file: Path) -> None:
    """A counter whose whole prompts cost more than their words (merges across words):
    the word-by-word costs are checked on the run's first prompts and dropped."""
    tok = LocalTokenizer(tokenizer_file)

    class Merging:
        name = "merging"
        requests = 0

        async def tokenize(self, text: str, *, as_sent: bool) -> Tokenized:
            got = tok.count(text, as_sent=as_sent)
            extra = 3 * sum(w.startswith("s") for w in text.split()) if as_sent else 0
            return Tokenized(got.count + extra, got.pieces)

    prompts = SyntheticPrompts(FIXED_300)
    with capture_logs() as logs:
        cal = run(calibrate(Merging(), prompts))
    assert cal.costs is None
    assert [e["event"] for e in logs] == ["prompt_word_costs_not_additive"]


def test_a_bad_tokenizer_file_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"not": "a tokenizer"}')
    with pytest.raises(ConfigError, match=r"workload\.tokenizer: .* is not a tokenizer\.json"):
        LocalTokenizer(bad)
    with pytest.raises(ConfigError, match=r"workload\.tokenizer: cannot read"):
        LocalTokenizer(tmp_path / "missing.json")


# --- the pieces, the stored form ------------------------------------------------------------


@pytest.mark.parametrize(
    ("pieces", "words", "costs"),
    [
        (["\u2581the", "\u2581ab", "le", "\u2581cat"], 3, (1, 2, 1)),  # sentencepiece
        (["the", "\u0120ab", "le", "\u0120cat"], 3, (1, 2, 1)),  # byte-level BPE
        ([" the", " ab", "le", " cat"], 3, (1, 2, 1)),  # llama.cpp's pieces
        (["\u2581the", "\u2581ab", "le"], 3, None),  # a word short
        (["the", "able", "cat"], 3, None),  # no word marks
    ],
)
def test_costs_from_pieces(pieces: list[str], words: int, costs: tuple[int, ...] | None) -> None:
    assert costs_from_pieces(pieces, words) == costs


def journaled(event: PromptCalibration) -> PromptCalibration:
    """``event`` as the journal gives it back (JSON, read typed)."""
    got = read_as(PromptCalibration, json.loads(json.dumps(event.to_data())))
    assert isinstance(got, PromptCalibration)
    return got


def test_calibration_round_trips_and_bad_documents_are_refused() -> None:
    cal = Calibration("tokenize", "vllm", tuple([2] * len(WORDS)), 1.0, 16.0, 40)
    event = journaled(carrying(CalibrationStage.START, cal))
    assert calibration_of(event) == cal
    good = event.to_data()
    for bad in (
        {"source": "magic"},
        {"costs": [1, 0]},
        {"costs": "1,2"},
        {"scale": 0.0},
        {"scale": SCALE_MAX * 2},
        {"scale": float("nan")},
        {"overhead": -1},
        {"from_seq": -3},
        {"from_seq": 1.5},
    ):
        with pytest.raises(ValueError, match="calibration"):  # unreadable, or no calibration
            stored([read_as(PromptCalibration, json.loads(json.dumps(good | bad)))])


def test_corrections() -> None:
    words = Calibration("tokenizer", "t.json", tuple([2] * len(WORDS)), 1.0, 1.0)
    fixed = words.corrected([300.0, 298.0], [316, 314], from_seq=10)
    assert fixed is not None
    # word-by-word costs keep their scale: the difference is the template's
    assert (fixed.costs, fixed.scale, fixed.overhead, fixed.from_seq) == (words.costs, 1.0, 16, 10)
    # a ratio from answers to one length: the overhead cannot be told apart yet
    first = UNCALIBRATED.corrected([200.0] * 4, [416] * 4, from_seq=7)
    assert first is not None
    assert (first.source, first.scale, first.overhead, first.costs) == ("usage", 2.08, 0, None)
    # answers to two lengths: the line through them, template and ratio apart
    both = first.corrected([200.0] * 4 + [96.0] * 4, [416] * 4 + [208] * 4, from_seq=30)
    assert both is not None
    assert (both.scale, both.overhead, both.from_seq) == (2.0, 16.0, 30)
    assert UNCALIBRATED.corrected([200.0], [3], from_seq=7) is None  # beyond belief
    assert words.corrected([300.0], [100], from_seq=7) is None  # a negative template
    assert words.corrected([], [], from_seq=7) is None


def test_prompts_before_a_correction_stay_as_they_were() -> None:
    prompts = SyntheticPrompts(FIXED_300, seed=2)
    before = [prompts.spec_fields(s) for s in range(100)]
    prompts.calibrate(Calibration("usage", "x", None, 0.25, 0.0, from_seq=50))  # a bigger pool
    assert [prompts.spec_fields(s) for s in range(50)] == before[:50]
    assert all(len(prompts.spec_fields(s)[0].split()) == 1200 for s in range(50, 100))
    with pytest.raises(ValueError, match="before the last one"):
        prompts.calibrate(Calibration("usage", "x", None, 1.0, 0.0, from_seq=10))


def test_stored_events_give_the_calibrations_in_order() -> None:
    start = Calibration("tokenize", "vllm", None, 2.0, 16.0)
    corrected = Calibration("tokenize", "vllm", None, 2.1, 16.8, from_seq=40)
    events = [
        journaled(replace(carrying(START, start), served={"vllm": 300.0})),
        journaled(replace(carrying(CHECK, corrected), changed=True)),
    ]
    got = stored(events)
    assert got.calibrations == [start, corrected]
    assert (got.reference, got.measured, got.checks_left) == ("vllm", True, CHECK_ROUNDS - 1)
    done = stored([*events, journaled(replace(carrying(CHECK, corrected), changed=False))])
    assert done.checks_left == 0
    fallback = stored([journaled(replace(carrying(START, None), failed={"a": "HTTP 404"}))])
    assert (fallback.calibrations, fallback.measured, fallback.reference) == ([], True, None)


# --- the check against the answers and the per-target tally ---------------------------------


class Server:
    """A server's usage for soakd's prompts: ``per_word`` tokens a word plus ``template``."""

    def __init__(self, prompts: SyntheticPrompts, per_word: float, template: int) -> None:
        self.prompts, self.per_word, self.template = prompts, per_word, template

    def answer(self, target: str, seq: int) -> Outcome:
        text, _ = self.prompts.spec_fields(seq)
        o = Outcome(target, "p", seq, 0, prompt_tokens=round(self.per_word * len(text.split())))
        o.prompt_tokens = (o.prompt_tokens or 0) + self.template
        return o


def test_the_answers_correct_an_uncalibrated_run_from_the_next_seq() -> None:
    """Nothing could tokenize: the first target to answer sizes the prompts; corrected
    from the next seq no target has used, until within 1 %."""
    prompts = SyntheticPrompts(FIXED_300)
    server = Server(prompts, per_word=2.0, template=16)
    events: list[PromptCalibration] = []
    seq = 0
    lengths = PromptLengths(
        prompts,
        ["a", "b"],
        checks=CHECK_ROUNDS,
        on_calibration=events.append,
        next_seq=lambda: seq + 1,  # the runner's: the answered one was sent
    )
    with capture_logs() as logs:
        while lengths.checking and seq < 400:
            lengths.record(server.answer("a", seq))
            seq += 1
    corrections = [e for e in events if e.changed]
    assert 1 <= len(corrections) <= CHECK_ROUNDS - 1
    assert events[-1].changed is False  # the last check found it within 1 %
    assert corrections[0].from_seq == CHECK_ANSWERS
    assert [journaled(e) for e in events] == events  # journaled as it was made
    assert {e.stage for e in events} == {CHECK}
    assert prompts.calibration.reference == "a"
    assert prompts.spec_fields(0)[0].count(" ") == 299  # sent already: kept
    late = [server.answer("a", s).prompt_tokens or 0 for s in range(seq, seq + 50)]
    assert abs(statistics.mean(late) / 300 - 1) < 0.02
    assert [e["event"] for e in logs][-1] == "prompt_calibration_checked"


def test_a_target_off_the_plan_is_named_once_and_tallied() -> None:
    prompts = SyntheticPrompts(FIXED_300)
    lengths = PromptLengths(prompts, ["good", "other"], checks=0)
    good, other = Server(prompts, 1.0, 0), Server(prompts, 1.5, 0)
    with capture_logs() as logs:
        for seq in range(3 * CHECK_ANSWERS):
            lengths.record(good.answer("good", seq))
            lengths.record(other.answer("other", seq))
    warned = [e for e in logs if e["event"] == "prompt_tokens_off_plan"]
    assert [(e["target"], e["off_pct"]) for e in warned] == [("other", 50.0)]
    rows = lengths.rows()
    assert rows["good"] == PromptRow(requests=48, planned=300, served=300, at_start=None)
    assert rows["other"].served == 450
    failed = Outcome("good", "p", 99, 0, prompt_tokens=5, error=ErrorKind.HTTP_5XX)
    lengths.record(failed)  # a failure's usage, if any, is not a served prompt
    assert lengths.rows()["good"].requests == 48
