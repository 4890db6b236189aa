"""The stream parser at the edge (soakd/targets/stream.py): every number and shape a server
sends is checked there. Usage counts that are not plausible integers are not taken (the
streamed count stays), a delta that is not text is a bad response, an answer past its bound
is cut, and nothing but ``Fault`` leaves the parser, whatever JSON arrives: the outcome is
then always storable by the journal, exportable by the metrics and carried by the wire."""

from __future__ import annotations

import asyncio
import itertools
import json
import sqlite3
from dataclasses import asdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soakd import outcome_record
from soakd.journal import schema
from soakd.journal.batch import Batch
from soakd.journal.codec import END_NS, outcome_row
from soakd.measure.fold import Fold
from soakd.metrics.run import Metrics
from soakd.model import ErrorKind, Outcome
from soakd.targets.errors import body_error
from soakd.targets.stream import Bounds, Fault, StreamParser, apply_usage, settle_usage
from soakd.workers import wire

MAX_TOKENS = 8
BOUNDS = Bounds.of(10, MAX_TOKENS, 100)  # 80 chunks, 1,000 prompt tokens


def parser(chat: bool = True, bounds: Bounds = BOUNDS) -> StreamParser:
    out = Outcome("t", "p", 0, 0)
    return StreamParser(out, chat, asyncio.Timeout(None), None, bounds=bounds)


def event(obj: Any) -> str:
    return json.dumps(obj)


def delta(content: Any, **more: Any) -> str:
    return event({"choices": [{"index": 0, "delta": {"content": content, **more}}]})


def usage(completion: Any, prompt: Any = 3) -> str:
    return event(
        {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
    )


def stream(events: list[str], chat: bool = True) -> Outcome:
    p = parser(chat)
    for i, data in enumerate(events):
        p.event(data, 1_000 + i)
    settle_usage(p.out, stream=True)
    return p.out


FIVE = [delta("tok") for _ in range(5)]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (-5, "negative"),
        (2**70, "implausible"),  # beyond 64 bits: once, 0 rows were journaled
        (2**63, "implausible"),
        (10 * MAX_TOKENS + 5 + 1, "implausible"),  # over 10 x max_tokens + streamed
        (4.5, "not_integer"),
        (5.0, "not_integer"),
        ("5", "not_integer"),
        (True, "not_integer"),  # a bool is an int to Python, not a count
        ([5], "not_integer"),
        ({"n": 5}, "not_integer"),
    ],
)
def test_a_usage_count_that_cannot_be_one_is_not_taken(value: Any, reason: str) -> None:
    out = stream([*FIVE, usage(value)])
    assert out.outcome == "ok"
    assert (out.output_tokens, out.usage_reported, out.usage_rejected) == (5, False, reason)
    assert out.prompt_tokens is None  # one bad count rejects the whole usage
    assert out.usage_delta is None


def test_a_bad_prompt_count_rejects_the_whole_usage() -> None:
    out = stream([*FIVE, usage(5, prompt=-1)])
    assert (out.output_tokens, out.usage_reported, out.usage_rejected) == (5, False, "negative")
    out = stream([*FIVE, usage(5, prompt=BOUNDS.prompt + 1)])
    assert out.usage_rejected == "implausible"
    out = stream([*FIVE, usage(5, prompt=BOUNDS.prompt)])  # at the bound: taken
    assert (out.prompt_tokens, out.usage_rejected) == (BOUNDS.prompt, "")


@pytest.mark.parametrize("value", [[1, 2], "lots", 7, True])
def test_usage_that_is_not_an_object_is_not_taken(value: Any) -> None:
    out = stream([*FIVE, event({"choices": [], "usage": value})])
    assert (out.outcome, out.output_tokens, out.usage_rejected) == ("ok", 5, "not_integer")


def test_a_plausible_usage_is_taken_and_both_counts_are_kept() -> None:
    out = stream([*FIVE, usage(6)])  # vLLM counts the stop token it does not stream
    assert (out.output_tokens, out.usage_reported, out.usage_rejected) == (6, True, "")
    assert (out.usage_delta, out.usage_mismatch) == (1, False)
    out = stream([*FIVE, usage(1)])  # fewer tokens than chunks: taken, and a mismatch
    assert (out.output_tokens, out.usage_delta, out.usage_mismatch) == (1, -4, True)
    out = stream([*FIVE, usage(10 * MAX_TOKENS + 5)])  # the bound itself: taken, a mismatch
    assert (out.output_tokens, out.usage_mismatch) == (85, True)
    out = stream([*FIVE, usage(None)])  # no completion count: the streamed one, no note
    assert (out.output_tokens, out.usage_reported, out.usage_rejected) == (5, False, "")
    assert out.prompt_tokens == 3


def test_usage_with_every_chunk_the_last_one_decides() -> None:
    """vLLM's continuous_usage_stats: a usage on every chunk."""
    events = [event({"choices": [], "usage": {"completion_tokens": -1}}), *FIVE, usage(5)]
    out = stream(events)
    assert (out.output_tokens, out.usage_reported, out.usage_rejected) == (5, True, "")
    out = stream([*FIVE, usage(5), usage(-3)])
    assert (out.output_tokens, out.usage_reported, out.usage_rejected) == (5, False, "negative")


@pytest.mark.parametrize("content", [{"text": "tok"}, ["tok"], 7, 0, True, False, {}, []])
def test_a_delta_that_is_not_text_is_a_bad_response(content: Any) -> None:
    p = parser()
    p.event(delta("a"), 1)
    with pytest.raises(Fault) as fault:
        p.event(delta(content), 2)
    assert fault.value.kind is ErrorKind.BAD_RESPONSE
    assert fault.value.detail == "delta content is not text"
    assert p.out.content_chunks == 1  # what came before it is kept, nothing invented


def test_reasoning_fields_count_and_are_checked_too() -> None:
    out = stream([delta(None, reasoning_content="think"), delta("", reasoning="more"), *FIVE])
    assert out.content_chunks == 7
    p = parser()
    with pytest.raises(Fault, match="reasoning_content is not text"):
        p.event(delta(None, reasoning_content={"x": 1}), 1)


def test_a_completions_choice_whose_text_is_not_text_is_a_bad_response() -> None:
    p = parser(chat=False)
    p.event(event({"choices": [{"text": "a"}]}), 1)
    with pytest.raises(Fault) as fault:
        p.event(event({"choices": [{"text": {"a": 1}}]}), 2)
    assert fault.value.kind is ErrorKind.BAD_RESPONSE


def test_an_answer_past_its_bound_is_cut_and_keeps_what_came() -> None:
    p = parser(bounds=Bounds.of(10, 2, 100))  # max_tokens 2: 20 content chunks
    for i in range(20):
        p.event(delta("t"), 1_000 * (i + 1))
    with pytest.raises(Fault) as fault:
        p.event(delta("t"), 99_000)
    assert fault.value.kind is ErrorKind.TOO_MANY_TOKENS
    assert (p.out.content_chunks, len(p.out.itl_ns)) == (20, 19)  # bounded: no more kept


def test_deep_nesting_and_huge_numbers_are_a_bad_chunk_not_a_crash() -> None:
    for payload in ("[" * 100_000, '{"usage": {"completion_tokens": 1' + "0" * 5000 + "}}"):
        with pytest.raises(Fault) as fault:
            parser().event(payload, 1)
        assert fault.value.kind is ErrorKind.BAD_CHUNK


def test_apply_usage_on_a_non_streamed_answer() -> None:
    out = Outcome("t", "p", 0, 0)
    out.content_chunks = 1
    apply_usage(out, {"completion_tokens": 40, "prompt_tokens": 9}, BOUNDS)
    settle_usage(out, stream=False)
    assert (out.output_tokens, out.prompt_tokens, out.usage_delta) == (40, 9, None)
    apply_usage(out, {"completion_tokens": 2**64}, BOUNDS)
    settle_usage(out, stream=False)
    # one body is no count: without a usage taken, the answer's tokens are unknown
    assert (out.output_tokens, out.usage_rejected) == (None, "implausible")
    assert out.tpot_ns is None


@pytest.mark.parametrize("usage", [None, {"completion_tokens": -5}, {"prompt_tokens": 2}])
def test_a_non_streamed_answer_without_usage_taken_has_no_count_made_up(usage: Any) -> None:
    out = Outcome("t", "p", 0, 0)
    out.content_chunks = 1  # text came, in one body
    if usage is not None:
        apply_usage(out, usage, BOUNDS)
    settle_usage(out, stream=False)
    assert out.output_tokens is None
    assert not out.usage_reported
    assert out.usage_delta is None
    empty = Outcome("t", "p", 0, 0)  # no text: no token, a count
    apply_usage(empty, {"completion_tokens": -5}, BOUNDS)
    settle_usage(empty, stream=False)
    assert empty.output_tokens == 0
    streamed = Outcome("t", "p", 0, 0)  # a stream's chunks are a count: kept
    streamed.content_chunks = 8
    apply_usage(streamed, {"completion_tokens": -5}, BOUNDS)
    settle_usage(streamed, stream=True)
    assert (streamed.output_tokens, streamed.usage_rejected) == (8, "negative")


# --- whatever the JSON: only Fault, and an outcome every reader takes ---------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([-1, 0, 2**31, 2**32, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=6,
)
USAGE = JSON | st.fixed_dictionaries({"prompt_tokens": JSON, "completion_tokens": JSON})
DELTA = JSON | st.fixed_dictionaries({"content": JSON}, optional={"reasoning_content": JSON})
CHUNK = st.fixed_dictionaries(
    {},
    optional={
        "choices": st.lists(
            st.fixed_dictionaries(
                {}, optional={"delta": DELTA, "text": JSON, "finish_reason": JSON}
            ),
            max_size=2,
        )
        | JSON,
        "usage": USAGE,
    },
)

_DB: list[sqlite3.Connection] = []
_IDS = itertools.count(1)


def journal_db() -> sqlite3.Connection:
    """An in-memory journal with the real schema, made once for every example."""
    if not _DB:
        conn = sqlite3.connect(":memory:", isolation_level=None)
        schema.create(conn, {"run_id": "x"})
        _DB.append(conn)
    return _DB[0]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunks=st.lists(CHUNK, max_size=6), chat=st.booleans(), streamed=st.booleans())
def test_any_json_in_usage_and_deltas_raises_only_fault_and_stores(
    chunks: list[dict[str, Any]], chat: bool, streamed: bool
) -> None:
    p = parser(chat)
    out = p.out
    out.sent_ns, out.end_ns = 1, 100_000
    for i, chunk in enumerate(chunks):
        try:
            p.event(json.dumps(chunk), 10 + i)
        except Fault:
            break
    # settled as a non-streamed answer too: its count may then be unknown (None)
    settle_usage(out, stream=streamed)
    # the journal stores it (64-bit integers, its row shape) and aggregates it
    row, ordered = outcome_row(out, next(_IDS), 1, 0)
    journal_db().execute(schema.INSERT_REQUEST, row)
    folded = Fold()
    folded.add(out, row[0], row[END_NS], 10**9, ordered)
    # the journal's batch carries it to its writer: the same row comes out
    batch = Batch()
    batch.add(out)
    (again,) = Batch.decode(batch.encode()).outcomes()
    assert outcome_row(again, row[0], 1, 0) == (row, ordered)
    # the metrics count it, and the worker wire carries it unchanged
    metrics = Metrics()
    metrics.add_target("t", ["p"])
    metrics.apply(folded)
    buf = bytearray()
    wire.pack_outcome(buf, 1, out)
    ((_, head, start, _),) = wire.unpack_outcomes(bytes(buf))
    back = Outcome("t", "p", 0, 0)
    outcome_record.fill(back, head, bytes(buf), start)
    back.itl_keys = out.itl_keys = None  # the gaps' buckets: a cache, computed either side
    assert asdict(back) == asdict(out)
    # and what it says is one of the things it may say
    assert out.usage_rejected in ("", "not_integer", "negative", "implausible")
    assert not (out.usage_reported and out.usage_rejected)
    assert out.output_tokens is None or out.output_tokens >= 0
    assert out.output_tokens is not None or not (streamed or out.usage_reported)
    assert out.prompt_tokens is None or 0 <= out.prompt_tokens <= BOUNDS.prompt


@pytest.mark.parametrize(
    ("error", "read"),
    [
        ({"type": "InternalServerError", "code": 500}, (ErrorKind.HTTP_5XX, 500)),  # vLLM
        ({"type": "server_error", "code": None}, (ErrorKind.HTTP_5XX, 500)),  # OpenAI's
        ({"type": "rate_limit", "code": "429"}, (ErrorKind.HTTP_429, 429)),
        ({"type": "NotFoundError", "code": 404}, (ErrorKind.HTTP_4XX, 404)),
        ({"type": "authentication_error", "code": 401}, (ErrorKind.HTTP_AUTH, 401)),
        ({"type": "invalid_api_key", "code": 400}, (ErrorKind.HTTP_AUTH, 400)),
        ({"type": "api_error", "code": None}, None),  # names no status
        ({"type": "moved", "code": 302}, None),
        ({"type": "odd", "code": 5000}, None),
    ],
)
def test_an_error_event_is_read_by_its_code_as_its_status(
    error: dict[str, Any], read: tuple[ErrorKind, int] | None
) -> None:
    """The parser's detail for an error event is what the preflight reads by its code
    (``body_error``, with ``status_kind``'s rule); the run counts it bad_response."""
    p = parser()
    with pytest.raises(Fault) as info:
        p.event(event({"error": {"message": "no", **error}}), 1)
    assert info.value.kind is ErrorKind.BAD_RESPONSE
    assert body_error(info.value.detail) == read
    assert body_error(f"http 302 {error['code']}") is None  # a status's detail: not a body's
