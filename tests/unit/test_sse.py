"""SSE decoder: the same events however the network splits the bytes."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soakd.targets.sse import SSEDecodeError, SSEDecoder, SSEError, SSELineTooLong

SAMPLE = (
    b": keep-alive comment\n"
    b"\n"
    b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n'
    b"\n"
    b"event: message\r\n"
    b"id: 7\r\n"
    b"retry: 1000\r\n"
    b'data: {"choices":[{"delta":{"content":"h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80"}}]}\r\n'
    b"\r\n"
    b"data: line one\r"
    b"data:line two\r"
    b"data\r"
    b"\r"
    b": ping\n\n\n\n"
    b'data: {"choices":[],"usage":{"completion_tokens":2}}\n\n'
    b"data: [DONE]\n\n"
)
EXPECTED = [
    '{"choices":[{"delta":{"role":"assistant"}}]}',
    '{"choices":[{"delta":{"content":"héllo € 😀"}}]}',
    "line one\nline two\n",
    '{"choices":[],"usage":{"completion_tokens":2}}',
    "[DONE]",
]


def decode(chunks: list[bytes], max_line: int = 1 << 20) -> list[str]:
    dec = SSEDecoder(max_line)
    events: list[str] = []
    for chunk in chunks:
        events += dec.feed(chunk)
    return events + dec.close()


def test_whole_stream() -> None:
    assert decode([SAMPLE]) == EXPECTED


def test_split_at_every_byte() -> None:
    for at in range(len(SAMPLE) + 1):
        assert decode([SAMPLE[:at], SAMPLE[at:]]) == EXPECTED, f"split at byte {at}"


def test_one_byte_at_a_time() -> None:
    assert decode([SAMPLE[i : i + 1] for i in range(len(SAMPLE))]) == EXPECTED


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(SAMPLE)), max_size=30))
def test_random_splits(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(SAMPLE)]
    chunks = [SAMPLE[a:b] for a, b in itertools.pairwise(bounds)]
    assert decode(chunks) == EXPECTED


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.text(
            alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\r\n"),
            max_size=40,
        ),
        max_size=8,
    ),
    st.sampled_from(["\n", "\r\n", "\r"]),
    st.data(),
)
def test_any_payload_any_line_end(payloads: list[str], eol: str, data: st.DataObject) -> None:
    """Arbitrary text (multibyte included) survives any split, with any line end."""
    raw = "".join(f"data: {p}{eol}{eol}" for p in payloads).encode()
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(raw)), max_size=10))
    bounds = [0, *sorted(cuts), len(raw)]
    chunks = [raw[a:b] for a, b in itertools.pairwise(bounds)]
    # An event whose data is one empty line is dispatched as "" (as browsers do).
    assert decode(chunks) == payloads


def test_crlf_split_between_cr_and_lf_is_one_line_end() -> None:
    dec = SSEDecoder()
    assert dec.feed(b"data: a\r") == []
    assert dec.feed(b"\n\r") == ["a"]
    assert dec.feed(b"\ndata: b\n\n") == ["b"]


def test_lone_cr_then_blank_line() -> None:
    # "\r\r" is two line ends (CR, then an empty line), not one CRLF.
    assert decode([b"data: x\r", b"\r"]) == ["x"]


def test_comments_and_keepalives_yield_nothing() -> None:
    dec = SSEDecoder()
    assert dec.feed(b": ping\n\n:\n\n\n\n\r\n") == []
    assert dec.feed(b"event: x\nid: 1\nretry: 5\n\n") == []
    assert dec.close() == []


def test_no_done_and_no_trailing_blank_line_is_flushed_by_close() -> None:
    dec = SSEDecoder()
    assert dec.feed(b'data: {"a":1}\n\ndata: {"b":2}') == ['{"a":1}']
    assert dec.close() == ['{"b":2}']
    assert dec.close() == []


def test_close_flushes_an_event_missing_only_its_blank_line() -> None:
    dec = SSEDecoder()
    assert dec.feed(b"data: [DONE]\n") == []
    assert dec.close() == ["[DONE]"]


def test_bom_is_stripped_once() -> None:
    bom = b"\xef\xbb\xbf"
    assert decode([bom[:2], bom[2:] + b"data: x\n\n"]) == ["x"]
    assert decode([b"data: x\n\n" + bom + b"data: y\n\n"]) == ["x"]  # not a field later on


def test_garbage_is_not_an_event() -> None:
    # Not JSON is the client's business; lines without a known field are ignored.
    assert decode([b"garbage\nmore garbage\n\ndata: {not json\n\n"]) == ["{not json"]


def test_invalid_utf8_in_data_raises_and_keeps_earlier_events() -> None:
    dec = SSEDecoder()
    with pytest.raises(SSEDecodeError) as info:
        dec.feed(b"data: ok\n\ndata: \xff\xfe\n\n")
    assert info.value.events == ["ok"]
    assert "\xff" not in str(info.value)


def test_invalid_utf8_in_a_comment_is_ignored() -> None:
    assert decode([b": \xff\n\ndata: ok\n\n"]) == ["ok"]


def test_multibyte_char_split_across_chunks() -> None:
    raw = "data: 😀€\n\n".encode()
    for at in range(len(raw) + 1):
        assert decode([raw[:at], raw[at:]]) == ["😀€"]


def test_long_line_in_one_chunk() -> None:
    dec = SSEDecoder(max_line=16)
    with pytest.raises(SSELineTooLong) as info:
        dec.feed(b"data: ok\n\ndata: " + b"x" * 20 + b"\n\n")
    assert info.value.events == ["ok"]


def test_long_line_growing_over_many_chunks() -> None:
    dec = SSEDecoder(max_line=16)
    dec.feed(b"data: ")
    dec.feed(b"x" * 10)
    with pytest.raises(SSELineTooLong):
        dec.feed(b"x" * 10)


def test_long_unfinished_tail_after_an_event() -> None:
    dec = SSEDecoder(max_line=16)
    with pytest.raises(SSELineTooLong) as info:
        dec.feed(b"data: a\n\n" + b"y" * 17)
    assert info.value.events == ["a"]


def test_line_at_the_limit_is_fine() -> None:
    line = b"data: " + b"z" * 10  # 16 bytes
    assert decode([line[:5], line[5:] + b"\n\n"], max_line=16) == ["z" * 10]
    assert decode([line + b"\r\n\r\n"], max_line=16) == ["z" * 10]


def test_errors_share_a_base() -> None:
    assert issubclass(SSEDecodeError, SSEError)
    assert issubclass(SSELineTooLong, SSEError)
    with pytest.raises(ValueError):
        SSEDecoder(max_line=0)
