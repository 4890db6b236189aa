"""soakd's trace ids reach the real vLLM (CPU) server's own spans: soakd sends a traceparent,
vLLM (``--otlp-traces-endpoint``) joins it to the span it exports over OTLP, and a small
OTLP/HTTP receiver here reads those spans. The trace id of every request soakd journaled is
the trace id of one of vLLM's spans, and that span's parent is soakd's span id.

Needs scripts/setup-vllm.sh (it installs vLLM's OpenTelemetry packages). vLLM exports over
gRPC by default; OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf makes it POST protobuf to
``/v1/traces``, which the standard library can receive.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from soakd.config import config_from_dict
from soakd.journal import JournalReader
from soakd.report import build_report
from soakd.report.export import records
from soakd.run.app import RunOptions, Soak
from soakd.tracing import span_id
from tests.vllm_server import VllmServer

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(600)]

SPANS_WAIT_S = 60.0  # vLLM's batch exporter sends every 0.2 s here (OTEL_BSP_SCHEDULE_DELAY)


class OtlpReceiver:
    """OTLP/HTTP trace receiver on 127.0.0.1:0: every span it is sent, as
    (trace id hex, span id hex, parent span id hex, name)."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, str, str]] = []
        self.posts = 0
        self.changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                found = [
                    (s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.name)
                    for rs in request.resource_spans
                    for ss in rs.scope_spans
                    for s in ss.spans
                ]
                with receiver.changed:
                    receiver.posts += 1
                    receiver.spans += found
                    receiver.changed.notify_all()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait_for_traces(self, trace_ids: set[str], timeout: float) -> set[str]:
        """Wait until spans of all these traces arrived (or ``timeout``); returns those seen."""

        def seen() -> set[str]:
            return trace_ids & {t for t, _, _, _ in self.spans}

        with self.changed:
            self.changed.wait_for(lambda: seen() == trace_ids, timeout)
            return seen()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def traced_vllm(receiver: OtlpReceiver) -> Iterator[VllmServer]:
    server = VllmServer(
        extra_args=["--otlp-traces-endpoint", receiver.url],
        env={
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        },
    )
    with server:
        yield server


async def test_vllm_exports_the_trace_ids_soakd_sent(
    traced_vllm: VllmServer, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    cfg = config_from_dict(
        {
            "run": {"name": "traced", "drain_timeout": "30s"},
            # a loopback target: the traceparent is on by default
            "targets": [
                {"name": "vllm", "base_url": traced_vllm.base_url, "model": traced_vllm.model}
            ],
            "workload": {"max_tokens": 8, "prompts": {"input_tokens": {"mean": 16}}},
            "phases": [
                {"name": "p", "duration": "4s", "load": {"mode": "closed", "concurrency": 2}}
            ],
        }
    )
    run_dir = tmp_path / "run"
    soak = Soak(cfg, RunOptions(run_dir=run_dir, metrics_addr="127.0.0.1:0", console_logs=False))
    result = await soak.run()
    assert result.completed
    assert result.summary["vllm"]["errors"] == 0

    with JournalReader(run_dir) as reader:
        sent = {rec["trace_id"]: rec["seq"] for rec in records(reader)}
    assert len(sent) >= 4
    assert None not in sent

    seen = receiver.wait_for_traces(set(sent), SPANS_WAIT_S)
    missing = set(sent) - seen
    assert not missing, (
        f"{len(missing)} of {len(sent)} trace ids soakd sent are in none of vLLM's "
        f"{len(receiver.spans)} exported spans ({receiver.posts} OTLP posts); "
        f"vLLM log: {traced_vllm.log_path}"
    )
    # vLLM's span of each request hangs under the span soakd named in its traceparent
    joined = [(t, p, name) for t, _, p, name in receiver.spans if t in sent]
    for trace, parent, name in joined:
        assert parent == span_id(result.run_id, "vllm", sent[trace]), name
    print(
        f"\ntraceparent round trip: {len(sent)} requests sent, {len(seen)} of their trace ids "
        f"in vLLM's spans ({sorted({n for _, _, n in joined})}), each under soakd's span id; "
        f"{len(receiver.spans)} spans in {receiver.posts} OTLP posts"
    )

    # the report's slowest request leads to one of those spans
    (slowest,) = build_report(run_dir).slowest["vllm"]["p"][:1]
    assert slowest.trace_id in seen
