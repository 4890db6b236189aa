"""The journal's writer link (soakd/journal/messages.py): every message, built from its
fields, comes back from its frame as itself, through the one codec both ends use; and the
writer reads every field of ``journal:`` (``WriterConfig`` against ``JournalConfig``)."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from datetime import UTC, datetime
from typing import Any, Literal, Union

import pytest

from soakd.config import JournalConfig
from soakd.journal import jsondoc
from soakd.journal import messages as m
from soakd.journal.counts import COUNTERS, GAUGES, LABELLED, WriterCounts
from soakd.measure.fold import Fold, fold
from soakd.model import ErrorKind, Outcome


def an_outcome(error: ErrorKind | None) -> Outcome:
    o = Outcome("alpha", "warm", 3, 1_000)
    o.sent_ns, o.first_token_ns, o.end_ns, o.wall_start = 2_000, 5_000_000, 9_000_000, 1.7e9
    o.status, o.error, o.output_tokens, o.prompt_tokens = 200 if error is None else 503, error, 4, 9
    return o


def example(hint: Any) -> Any:
    """A value of the type ``hint``, none of them a default."""
    if jsondoc._is_json(hint):
        return {"a": [1, 2.5, "x", None, True, {"b": False}]}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union or isinstance(hint, types.UnionType):
        return example(next(a for a in args if a is not type(None)))
    if origin is Literal:
        return args[-1]
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return (example(args[0]), example(args[0]))
        return tuple(example(a) for a in args)
    if origin is list:
        return [example(args[0])]
    if origin is dict:
        return {example(args[0]): example(args[1])}
    if hint is Fold:
        return fold([an_outcome(None), an_outcome(ErrorKind.HTTP_5XX)])
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return list(hint)[-1]
    if dataclasses.is_dataclass(hint):
        return built(hint)
    return {
        bool: True,
        int: 7,
        float: 2.5,
        str: "text",
        bytes: b"\x00records\xff",
        datetime: datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
    }[hint]


def built(cls: Any) -> Any:
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: example(hints[f.name]) for f in dataclasses.fields(cls)})


def comparable(value: Any) -> Any:
    """``value`` with its types spelled out (a tuple is no list), a Fold as what it sends."""
    if isinstance(value, Fold):
        return ("Fold", value.to_doc())
    if dataclasses.is_dataclass(value):
        return (
            type(value),
            {f.name: comparable(getattr(value, f.name)) for f in dataclasses.fields(value)},
        )
    if isinstance(value, list | tuple):
        return (type(value), [comparable(v) for v in value])
    if isinstance(value, dict):
        return {
            comparable(k) if not isinstance(k, tuple) else k: comparable(v)
            for k, v in value.items()
        }
    return (type(value), value)


def through_the_link(msg: m.Message) -> m.Message:
    data = m.encode(msg)
    reader = m.frames()
    ((kind, payload),) = reader.feed(data[:5]) + reader.feed(data[5:])
    assert kind == msg.KIND
    return m.decode(kind, payload)


def test_every_message_is_registered_once() -> None:
    # by name: a slotted dataclass is a new class, the one it was made from stays a subclass
    assert {c.__name__ for c in m.Message.__subclasses__()} == {
        c.__name__ for c in m.MESSAGES.values()
    }
    assert all(kind == cls.KIND for kind, cls in m.MESSAGES.items())
    assert sorted(m.MESSAGES) == list(range(1, len(m.MESSAGES) + 1))


@pytest.mark.parametrize("cls", m.MESSAGES.values(), ids=lambda c: c.__name__)
def test_every_message_comes_back_as_itself(cls: type[m.Message]) -> None:
    sent = built(cls)
    got = through_the_link(sent)
    assert comparable(got) == comparable(sent)
    assert m.encode(got) == m.encode(sent)
    if not any(isinstance(getattr(sent, f.name), Fold) for f in dataclasses.fields(sent)):
        assert got == sent


def test_a_message_with_its_defaults_comes_back_too() -> None:
    for msg in (m.Packet(1, None), m.Stats(), m.Close(), m.Closed()):
        assert through_the_link(msg) == msg
    assert not m.Stats()
    assert m.Stats(commit=(0.01,))


def test_a_broken_frame_is_a_link_error() -> None:
    for kind, payload in (
        (99, b"{}"),  # no such message
        (m.HELLO, b"{not json"),
        (m.COMMITTED, b"[1]"),  # not an object
        (m.COMMITTED, b"{}"),  # no through
        (m.COMMITTED, b'{"through": "7"}'),  # not an int
        (m.PACKET, b"\x01"),  # cut inside the length of its JSON
    ):
        with pytest.raises(m.LinkError):
            m.decode(kind, payload)


NOT_DEFAULT: dict[str, Any] = {
    "synchronous": "normal",
    "flush_interval": 0.25,
    "queue_size": 500,
    "keep_samples": 3600.0,
    "keep_requests": 7200.0,
    "max_bytes": 5_000_000,
    "itl_gaps": False,
    "itl": "exact",
}
"""A valid value for every field of ``journal:``, none its default."""


def writer_type(annotation: Any) -> Any:
    """A config field's type as the writer declares it: pydantic's constraints left out."""
    if typing.get_origin(annotation) is typing.Annotated:
        return writer_type(typing.get_args(annotation)[0])
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is Union:
        return Union[tuple(writer_type(a) for a in typing.get_args(annotation))]  # noqa: UP007
    return annotation


def test_the_writer_reads_every_field_of_journal() -> None:
    """``WriterConfig`` is ``JournalConfig``'s fields, typed as the config types them, and
    takes its defaults from it: a field added to ``journal:`` reaches the writer or fails
    every start (here first), never dropped in silence."""
    config_fields = JournalConfig.model_fields
    writer_fields = {f.name: f for f in dataclasses.fields(m.WriterConfig)}
    assert list(writer_fields) == list(config_fields)
    hints = typing.get_type_hints(m.WriterConfig)
    for name, info in config_fields.items():
        assert writer_type(info.annotation) == writer_type(hints[name]), name
        assert writer_fields[name].default is dataclasses.MISSING, name  # the config's own
    assert dataclasses.asdict(m.WriterConfig.of(JournalConfig())) == JournalConfig().model_dump()
    assert set(NOT_DEFAULT) == set(config_fields)  # a new option: give it a value there
    cfg = JournalConfig.model_validate(NOT_DEFAULT)
    assert all(getattr(cfg, n) != f.default for n, f in config_fields.items())
    changed = m.WriterConfig(**NOT_DEFAULT)
    assert m.WriterConfig.of(cfg) == changed
    hello = through_the_link(m.Hello("j.db", built(m.RunInfo), m.WriterConfig.of(cfg), None, 0))
    assert isinstance(hello, m.Hello)
    assert hello.journal == changed

    class Newer:  # a journal option the writer does not declare
        def model_dump(self) -> dict[str, Any]:
            return {**JournalConfig().model_dump(), "new_option": 1}

    with pytest.raises(TypeError, match="new_option"):
        m.WriterConfig.of(Newer())


def test_the_writers_counts_are_the_stats_it_sends() -> None:
    names = {f.name for f in dataclasses.fields(m.Stats)}
    assert names == {*COUNTERS, *GAUGES, *LABELLED, "commit"}
    counts = WriterCounts()
    counts.records.labels("request").inc(3)
    counts.size.set(4096)
    counts.commit.observe(0.02)
    stats = counts.drain()
    assert stats == m.Stats(size=4096, records={"request": 3.0}, commit=(0.02,))
    assert through_the_link(stats) == stats
    assert not counts.drain()
