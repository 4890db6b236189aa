"""Trace ids: the traceparent soakd sends, which targets send one, and the exemplars that
carry the id on the latency histograms (OpenMetrics only)."""

from __future__ import annotations

import re
from array import array
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from soakd.config import ConfigError, TargetConfig, config_from_dict
from soakd.config.redact import config_doc
from soakd.journal.stored import StoredConfig
from soakd.measure.fold import fold
from soakd.metrics.run import Metrics
from soakd.model import ErrorKind, Outcome
from soakd.tracing import (
    is_local_url,
    span_id,
    trace_id,
    traceparent,
    wants_traceparent,
)

W3C = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-01$")


def test_traceparent_is_w3c_sampled_and_derived_from_run_target_and_seq() -> None:
    header = traceparent("run-1", "local", 7)
    m = W3C.match(header)
    assert m is not None, header
    assert m.group(1) == trace_id("run-1", "local", 7)
    assert m.group(2) == span_id("run-1", "local", 7)
    assert m.group(1) != "0" * 32
    assert m.group(2) != "0" * 16
    # the same request gives the same id, any other request another one
    assert traceparent("run-1", "local", 7) == header
    others = {
        trace_id(r, t, s)
        for r in ("run-1", "run-2")
        for t in ("local", "cloud")
        for s in range(1000)
    }
    assert len(others) == 4000


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("http://127.0.0.1:8000", True),
        ("http://localhost:8000/v1", True),
        ("http://[::1]:8000", True),
        ("http://10.0.0.5:8000", True),
        ("http://192.168.1.20", True),
        ("http://172.16.3.4:9000", True),
        ("https://api.openai.com/v1", False),
        ("https://8.8.8.8", False),
        ("http://vllm.internal:8000", False),  # a name is not resolved: counts as remote
    ],
)
def test_local_urls(url: str, local: bool) -> None:
    assert is_local_url(url) is local


def target(**kw: Any) -> TargetConfig:
    return TargetConfig.model_validate({"name": "t", **kw})


def test_on_by_default_for_local_targets_only() -> None:
    assert wants_traceparent(target(base_url="http://127.0.0.1:8000"))
    assert wants_traceparent(target(simulator="edge-4gb"))
    assert wants_traceparent(target(base_url="https://api.example.com", gateway={}))
    assert not wants_traceparent(target(base_url="https://api.example.com"))
    # asked for, either way
    assert wants_traceparent(target(base_url="https://api.example.com", traceparent=True))
    assert not wants_traceparent(target(base_url="http://127.0.0.1:8000", traceparent=False))


def test_traceparent_must_be_a_boolean() -> None:
    with pytest.raises(ConfigError, match="traceparent"):
        config_from_dict(
            {
                "targets": [
                    {"name": "t", "base_url": "http://127.0.0.1:1", "traceparent": "sometimes"}
                ],
                "phases": [{"name": "p", "duration": "1m", "load": {"mode": "idle"}}],
            }
        )


def test_the_stored_config_says_which_targets_sent_one() -> None:
    cfg = config_from_dict(
        {
            "targets": [
                {"name": "edge", "base_url": "http://127.0.0.1:8000"},
                {"name": "cloud", "base_url": "https://api.example.com"},
                {
                    "name": "cloud-traced",
                    "base_url": "https://api.example.com",
                    "traceparent": True,
                },
                {"name": "edge-quiet", "base_url": "http://127.0.0.1:8001", "traceparent": False},
            ],
            "phases": [{"name": "p", "duration": "1m", "load": {"mode": "idle"}}],
        }
    )
    doc = config_doc(cfg)
    assert StoredConfig.model_validate(doc).traced() == {"edge", "cloud-traced"}
    # the one rule: as a target's own requests were sent
    assert {t.name for t in cfg.targets if wants_traceparent(t)} == {"edge", "cloud-traced"}
    # a journal written before soakd sent traceparents has no such key: nothing traced
    for t in doc["targets"]:
        del t["traceparent"]
    assert StoredConfig.model_validate(doc).traced() == frozenset()


def ok_outcome(target: str, seq: int, e2e_s: float) -> Outcome:
    o = Outcome(target, "steady", seq, 0)
    o.sent_ns, o.first_token_ns = 1, 1 + int(e2e_s * 1e9 / 4)
    o.last_token_ns = o.end_ns = 1 + int(e2e_s * 1e9)
    o.status, o.output_tokens, o.content_chunks = 200, 3, 3
    o.itl_ns = array("q", [1_000_000, 1_000_000])
    return o


def exemplar_ids(text: str, family: str) -> dict[str, set[str]]:
    """le -> trace ids of the exemplars on ``family``'s buckets, per target."""
    found: dict[str, set[str]] = {}
    for line in text.splitlines():
        m = re.match(
            rf'{family}_bucket\{{le="([^"]+)",target="([^"]+)"\}} \S+ '
            r'# \{trace_id="([0-9a-f]+)"\}',
            line,
        )
        if m:
            found.setdefault(m.group(2), set()).add(m.group(3))
    return found


def test_latency_exemplars_carry_the_trace_id_in_openmetrics_only() -> None:
    m = Metrics(CollectorRegistry())
    for name in ("edge", "cloud"):
        m.add_target(name, ["steady"])
    m.trace_exemplars(
        "run-9",
        [
            target(name="edge", base_url="http://127.0.0.1:1"),
            target(name="cloud", base_url="https://api.example.com"),
        ],
    )
    m.apply(fold([ok_outcome("edge", 41, 0.3)]))
    m.apply(fold([ok_outcome("edge", 42, 12.0)]))  # the slow one, in a bucket of its own
    m.apply(fold([ok_outcome("cloud", 5, 12.0)]))
    failed = ok_outcome("edge", 43, 40.0)
    failed.error = ErrorKind.HTTP_5XX
    m.apply(fold([failed]))  # failures stay out of the latency histograms, exemplars too

    om = openmetrics_latest(m.registry).decode()
    e2e = exemplar_ids(om, "soakd_request_duration_seconds")
    assert e2e == {"edge": {trace_id("run-9", "edge", 41), trace_id("run-9", "edge", 42)}}
    assert exemplar_ids(om, "soakd_time_to_first_token_seconds") == e2e
    slow_bucket = re.search(
        r'soakd_request_duration_seconds_bucket\{le="15.0",target="edge"\} 2.0 # '
        r'\{trace_id="([0-9a-f]+)"\} 12.0',
        om,
    )
    assert slow_bucket is not None
    assert slow_bucket.group(1) == trace_id("run-9", "edge", 42)
    # the classic text format (what a scraper gets unless it asks) has no exemplars
    assert "trace_id" not in generate_latest(m.registry).decode()


def test_a_bucket_takes_a_new_exemplar_at_most_once_a_second() -> None:
    """Prometheus reads one exemplar per bucket per scrape: within a second the bucket keeps
    the first request's, a second later the next request's replaces it, and a request in
    another bucket (the slow one) always brings its own."""
    m = Metrics(CollectorRegistry())
    m.add_target("edge", ["steady"])
    m.trace_exemplars("run-9", [target(name="edge", base_url="http://127.0.0.1:1")])

    def at(seq: int, e2e_s: float, end_s: float) -> Outcome:
        o = ok_outcome("edge", seq, e2e_s)
        shift = int(end_s * 1e9) - o.end_ns
        o.sent_ns += shift
        o.first_token_ns = (o.first_token_ns or 0) + shift
        o.last_token_ns = o.end_ns = o.end_ns + shift
        return o

    m.apply(fold([at(1, 0.3, 100.0)]))
    m.apply(fold([at(2, 0.3, 100.5)]))  # same bucket, half a second later: kept out
    m.apply(fold([at(3, 12.0, 100.6)]))  # another bucket: its own exemplar
    first = exemplar_ids(openmetrics_latest(m.registry).decode(), "soakd_request_duration_seconds")
    assert first == {"edge": {trace_id("run-9", "edge", 1), trace_id("run-9", "edge", 3)}}
    m.apply(fold([at(4, 0.3, 101.2)]))  # the first bucket's is due again
    later = exemplar_ids(openmetrics_latest(m.registry).decode(), "soakd_request_duration_seconds")
    assert later == {"edge": {trace_id("run-9", "edge", 4), trace_id("run-9", "edge", 3)}}
