"""Cloud dialects of the OpenAI client against a local fake: Azure paths and ``api-key``,
organisation/project headers, custom paths, Retry-After, which 400s are auth failures; and
a spend cap in a real run (the simulator as the paid endpoint)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from soakd.config import TargetConfig
from soakd.model import ErrorKind, RequestSpec
from soakd.targets import open_target
from soakd.targets.errors import retry_after

pytestmark = [pytest.mark.integration, pytest.mark.timeout(20)]

KEY = "sk-cloud-SECRET-0123456789"
KEY_ENV = "SOAKD_TEST_CLOUD_KEY"
SPEC = RequestSpec("t", "p", 0, "hello there", 2, 4, 0.0, 0)


class Fake:
    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.answer: web.Response | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(
            {
                "path": request.path_qs,
                "headers": dict(request.headers),
                "body": await request.json(),
            }
        )
        if self.answer is not None:
            return self.answer
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for part in (
            {"choices": [{"index": 0, "delta": {"content": "hi"}}]},
            {
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 2, "completion_tokens": 1},
            },
        ):
            await resp.write(b"data: " + json.dumps(part).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Fake, str]]:
    monkeypatch.setenv(KEY_ENV, KEY)
    f = Fake()
    app = web.Application()
    app.router.add_post("/{tail:.*}", f.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f, f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def send(base: str, **kw: Any) -> Any:
    tcfg = TargetConfig(name="t", base_url=base, api_key_env=KEY_ENV, model="gpt-4o", **kw)
    target = await open_target(tcfg)
    try:
        return await target.send(SPEC)
    finally:
        await target.aclose()


async def test_azure_path_query_and_api_key_header(fake: tuple[Fake, str]) -> None:
    f, base = fake
    out = await send(base, kind="azure", api_version="2024-06-01", deployment="prod-4o")
    assert out.ok, out.error_detail
    seen = f.seen[0]
    assert seen["path"] == "/openai/deployments/prod-4o/chat/completions?api-version=2024-06-01"
    assert seen["headers"]["api-key"] == KEY
    assert "Authorization" not in seen["headers"]
    assert out.output_tokens == 1
    assert out.prompt_tokens == 2


async def test_openai_compatible_cloud_path_and_org_headers(fake: tuple[Fake, str]) -> None:
    f, base = fake
    out = await send(
        base,
        path="/gw/openai/chat",
        organization="org-1",
        project="proj-9",
        headers={"X-Team": "edge"},
    )
    assert out.ok, out.error_detail
    seen = f.seen[0]
    assert seen["path"] == "/gw/openai/chat"
    assert seen["headers"]["Authorization"] == f"Bearer {KEY}"
    assert seen["headers"]["OpenAI-Organization"] == "org-1"
    assert seen["headers"]["OpenAI-Project"] == "proj-9"
    assert seen["headers"]["X-Team"] == "edge"


def error(status: int, type_: str, code: str, headers: dict[str, str] | None = None
          ) -> web.Response:  # fmt: skip
    body = {"error": {"message": f"key {KEY} refused", "type": type_, "param": None,
                      "code": code}}  # fmt: skip
    return web.json_response(body, status=status, headers=headers)


@pytest.mark.parametrize(
    ("status", "type_", "code", "kind"),
    [
        (401, "auth_error", "401", ErrorKind.HTTP_AUTH),  # LiteLLM, no key
        (400, "no_db_connection", "400", ErrorKind.HTTP_AUTH),  # LiteLLM, a wrong key
        (400, "invalid_request_error", "invalid_api_key", ErrorKind.HTTP_AUTH),
        (400, "invalid_request_error", "400", ErrorKind.HTTP_4XX),  # unknown model etc.
        (403, "permission_error", "403", ErrorKind.HTTP_AUTH),
    ],
)
async def test_auth_failures(
    fake: tuple[Fake, str], status: int, type_: str, code: str, kind: ErrorKind
) -> None:
    f, base = fake
    f.answer = error(status, type_, code)
    out = await send(base)
    assert out.error is kind
    assert KEY not in out.error_detail
    assert KEY[:12] not in out.error_detail


async def test_retry_after_reaches_the_outcome(fake: tuple[Fake, str]) -> None:
    f, base = fake
    f.answer = error(429, "rate_limit_exceeded", "429", {"Retry-After": "7"})
    out = await send(base)
    assert out.error is ErrorKind.HTTP_429
    assert out.retry_after_s == 7.0
    f.answer = error(503, "service_unavailable", "queue_timeout", {"retry-after-ms": "1500"})
    out = await send(base)
    assert out.error is ErrorKind.HTTP_5XX
    assert out.retry_after_s == 1.5


def test_retry_after_forms() -> None:
    soon = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 28 <= (retry_after({"Retry-After": soon})[0] or 0) <= 30
    assert retry_after({"Retry-After": "0"}) == (0.0, False)
    assert retry_after({"Retry-After": "soon"}) == (None, True)  # there, not readable
    assert retry_after({"retry-after-ms": "x", "Retry-After": "2"}) == (2.0, False)
    assert retry_after({}) == (None, False)


async def test_spend_cap_in_a_real_run_is_exact_logged_journaled_exported(
    tmp_path: Path,
) -> None:
    from soakd.config import config_from_dict
    from soakd.journal import JournalReader, records
    from soakd.run.app import RunOptions, Soak

    cfg = config_from_dict({
        "run": {"name": "cap", "drain_timeout": "5s"},
        "targets": [{"name": "cloud", "simulator": "fast", "spend": {"max_requests": 25}}],
        "workload": {"max_tokens": 8, "prompts": {"input_tokens": {"mean": 8}}},
        "phases": [{"name": "p", "duration": "3s", "load": {"mode": "closed", "concurrency": 4}}],
        "gpu": {"source": "none"},
    })  # fmt: skip
    soak = Soak(cfg, RunOptions(run_dir=tmp_path / "run", metrics_addr="127.0.0.1:0",
                                console_logs=False))  # fmt: skip
    result = await soak.run()
    assert result.completed
    assert result.summary["cloud"]["requests"] == 25  # four workers, not one more
    get = soak.metrics.registry.get_sample_value
    assert get("soakd_target_paused", {"target": "cloud", "reason": "spend_cap"}) == 1
    assert get("soakd_spend_cap_hits_total", {"target": "cloud", "cap": "requests"}) == 1
    assert get("soakd_spend_used", {"target": "cloud", "cap": "requests"}) == 25
    with JournalReader(tmp_path / "run") as reader:
        paused = [e for e in reader.events() if isinstance(e.event, records.TargetPaused)]
    assert len(paused) == 1
    log = (tmp_path / "run" / "soakd.log").read_text()
    assert '"event": "target_paused"' in log
    assert '"cap": "requests"' in log
