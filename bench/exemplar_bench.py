"""Exemplar bench: what a trace id costs on the hot path (ns per call, best of rounds).

    .venv/bin/python bench/exemplar_bench.py
    .venv/bin/python bench/exemplar_bench.py -n 200000 --rounds 7

Prints, per call:

- ``observe``: a latency histogram child's ``observe(v)``, as ``Metrics.record`` did;
- ``observe + exemplar``: ``observe(v, {"trace_id": ...})`` with the id already known;
- ``trace_id``: deriving the id (soakd/tracing.py, one blake2b);
- ``traceparent``: the header value the client builds per request (two blake2b);
- ``Metrics.record``: a whole successful 128-token outcome, as shipped (exemplars on e2e
  and ttft);
- ``Metrics.record, no exemplars``: the same with the trace ids switched off;
- what the exemplars add per successful request, derived from the rows above (the two
  ``Metrics.record`` rows differ by less than their noise on a busy machine).
"""

from __future__ import annotations

import argparse
import time
from array import array
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Histogram

from soakd.metrics.run import E2E_BUCKETS, Metrics
from soakd.model import Outcome
from soakd.tracing import trace_id, traceparent

RUN_ID = "bench-20261201-000000-abcd"


def best_ns(fn: Callable[[int], object], n: int, rounds: int) -> float:
    """The best mean over ``rounds`` of ``n`` calls of ``fn(i)``, in ns per call."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for i in range(n):
            fn(i)
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


def outcome(i: int) -> Outcome:
    o = Outcome("bench", "steady", i, 0)
    o.sent_ns, o.first_token_ns, o.last_token_ns, o.end_ns = 1, 20_000_001, 900_000_001, 900_000_001
    o.status, o.output_tokens, o.usage_reported, o.content_chunks = 200, 128, True, 128
    o.itl_ns = array("q", [7_000_000] * 127)
    return o


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=100_000, help="calls per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    n, rounds = args.n, args.rounds

    hist = Histogram(
        "h", "h", ["target"], buckets=E2E_BUCKETS, registry=CollectorRegistry()
    ).labels("bench")
    values = [0.05 + (i % 997) / 100 for i in range(n)]
    ids = [trace_id(RUN_ID, "bench", i) for i in range(n)]
    rows = [
        ("observe", best_ns(lambda i: hist.observe(values[i]), n, rounds)),
        (
            "observe + exemplar",
            best_ns(lambda i: hist.observe(values[i], {"trace_id": ids[i]}), n, rounds),
        ),
        ("trace_id", best_ns(lambda i: trace_id(RUN_ID, "bench", i), n, rounds)),
        ("traceparent", best_ns(lambda i: traceparent(RUN_ID, "bench", i), n, rounds)),
    ]
    outcomes = [outcome(i) for i in range(min(n, 20_000))]
    k = len(outcomes)
    for label, traced in (("Metrics.record", True), ("Metrics.record, no exemplars", False)):
        m = Metrics(CollectorRegistry())
        m.add_target("bench", ["steady"])
        if traced:
            m.trace_exemplars(RUN_ID, {"bench"})
        rows.append((label, best_ns(lambda i, m=m: m.record(outcomes[i]), k, rounds)))
    by = dict(rows)
    added = 2 * (by["observe + exemplar"] - by["observe"]) + by["trace_id"]
    rows.append(("added per request (2 exemplars + 1 id)", added))
    width = max(len(label) for label, _ in rows)
    for label, ns in rows:
        print(f"{label:<{width}}  {ns:8.0f} ns")
    print(f"added / Metrics.record: {added / by['Metrics.record, no exemplars']:.1%}")


if __name__ == "__main__":
    main()
