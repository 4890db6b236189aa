"""A fleet rehearsal with the real binaries, nothing mocked: three edge sites, a central
Prometheus fed by their remote_write, a 3-peer Alertmanager cluster and a counting webhook.

Each site is a real `soakd run` (run.node, run.site) against its own simulator, and an edge
Prometheus with the shipped prometheus.yml, rules and deploy/central/edge-prometheus.snippet.yml
merged in (external labels node and site, remote_write to the central, alerts to all three
peers). The central is deploy/central/prometheus.yml with --web.enable-remote-write-receiver
and the central rules (rules/fleet-nodes.yml listing the three boxes); the peers run
deploy/central/alertmanager.yml. Debian's prometheus 2.42 and alertmanager 0.25, as plain
processes on 127.0.0.1.

What a fleet's operator relies on, asserted:

- every notification names its node and site (labels and summary), and no alert is
  notified twice while it fires: three peers, one notification;
- the sending peer killed (SIGKILL) loses no page: the next pages arrive once;
- a 60 s central outage leaves no gap: after the edges replay their WAL, the central's
  samples of the outage and its counter increases equal each edge's own;
- a target down at site A (TargetDown) does not suppress the page of site B's target of
  the same name (ErrorRatioHigh), in the same cluster;
- soakd killed at site C pages for C only: SoakdDown from C's edge, EdgeSoakdMissing from
  the central; no box is ever called unreachable;
- every dashboard expression returns data centrally for each site, one series set per box
  ("All" never merges them), equal to what the box's own Prometheus answers; per box the
  central holds every series the edge holds; and against a second central that federates
  the edges, with Grafana's rate interval for its pull interval, data for every box;
- `soakd report --fleet` on the three run directories puts the failing boxes first.

Test clock, not shipped semantics: the `for:` of SoakdDown, ErrorRatioHigh and
EdgeSoakdMissing is shortened (rules_with_for), the central evaluates every second; the
expressions, routes, inhibitions and intervals are the shipped ones. The figures (page
delay at the webhook, outage gap, catch-up, series per site, expressions with data) are
printed for docs/deployment.md. About three minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from soakd.profiles import get_profile
from soakd.report.fleet import build_fleet
from soakd.sim.server import SimServer, start_sim

try:
    from tests import observability as obs
except ModuleNotFoundError:  # tests/integration is not a package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests import observability as obs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SITES = (("edge-a", "lab-a"), ("edge-b", "lab-b"), ("edge-c", "lab-c"))
# three speeds, so that a merged quantile would show
DECODE_S = {"edge-a": 0.002, "edge-b": 0.006, "edge-c": 0.012}
# shipped: 1m, 1m; ErrorRatioHigh longer than TargetDown's 10 s, as shipped, so that a
# box whose server is gone pages TargetDown first and inhibits its own error page
EDGE_WAITS = {"SoakdDown": "10s", "ErrorRatioHigh": "20s"}
CENTRAL_WAITS = {"EdgeSoakdMissing": "10s"}  # shipped: 5m
OUTAGE_S = 60.0
FEDERATION_S = 5  # the federation's pull interval on the test's clock (shipped: 30 s)
RATE = 4.0  # requests per second at each site

# Bounds on a hang, not measurements (those are printed): a page's own wait, plus
# Alertmanager's group_wait (5 s page, 30 s warn), plus up to 2 x its 15 s peer timeout
# while a killed peer is still counted, plus a loaded 2-core machine.
TARGET_DOWN_WITHIN = 60.0
PAGE_WITHIN = 90.0
WARN_WITHIN = 120.0

JITTER_NEEDS = "jitter1h"  # three 5-minute P99s: longer than this test
NVML_ONLY = "NVML only"  # the simulator's GPU is read through DCGM names
GATEWAY_ROW = "soakd_gateway_"  # no guard gateway in these runs
ALERT_LIST = "ALERTS{"  # the list of alerts firing: empty for a box where none fires


# --- the counting webhook ----------------------------------------------------------------


@dataclass
class Webhook:
    """Every notification the cluster sends, with its arrival time."""

    received: list[tuple[float, dict[str, Any]]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.received.append((time.monotonic(), await request.json()))
        return web.Response(text="ok")

    def alerts(self) -> list[tuple[float, dict[str, Any]]]:
        return [(t, a) for t, n in self.received for a in n["alerts"]]

    def firing(self, name: str, node: str) -> list[float]:
        return [
            t
            for t, a in self.alerts()
            if a["status"] == "firing"
            and a["labels"]["alertname"] == name
            and a["labels"].get("node") == node
        ]

    def summary(self) -> list[str]:
        return [
            f"{a['status']} {a['labels'].get('alertname')} {a['labels'].get('node')}"
            for _, a in self.alerts()
        ]


async def poll(
    check: Callable[[], Awaitable[object]], within: float, what: str, every: float = 0.25
) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {within:g} s")
        await asyncio.sleep(every)


# --- the fleet -----------------------------------------------------------------------------


@dataclass
class Site:
    node: str
    site: str
    sim: SimServer
    sim_port: int
    soakd: asyncio.subprocess.Process
    soakd_addr: str
    prometheus: obs.Daemon
    sim_open: bool = True


@dataclass
class Fleet:
    sites: dict[str, Site]
    central: obs.Daemon
    federation: obs.Daemon
    peers: list[obs.Daemon]
    webhook: Webhook
    http: aiohttp.ClientSession
    figures: dict[str, Any] = field(default_factory=dict)

    async def query(self, prom: obs.Daemon, expr: str, at: float | None = None) -> list[Any]:
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        async with self.http.get(prom.url + "/api/v1/query", params=params) as resp:
            body = await resp.json()
        assert body["status"] == "success", (expr, body)
        result: list[Any] = body["data"]["result"]
        return result

    async def query_range(
        self, prom: obs.Daemon, expr: str, start: float, end: float, step: float = 1
    ) -> list[dict[str, Any]]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        async with self.http.get(prom.url + "/api/v1/query_range", params=params) as resp:
            body = await resp.json()
        assert body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    async def scalar(self, prom: obs.Daemon, expr: str, at: float | None = None) -> float:
        result = await self.query(prom, expr, at)
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])


def soak_config(node: str, site: str, sim_url: str) -> dict[str, Any]:
    return {
        "run": {"name": f"fleet-{node}", "node": node, "site": site, "drain_timeout": "2s"},
        "targets": [{"name": "vllm", "base_url": sim_url, "model": "m"}],
        "workload": {"max_tokens": 24, "prompts": {"input_tokens": {"mean": 40}}},
        "phases": [
            {"name": "steady", "duration": "20m", "load": {"mode": "poisson", "rate": RATE}}
        ],
        "gpu": {
            "source": "dcgm",
            "dcgm_url": sim_url + "/metrics",
            "interval": "1s",
            "leak_window": "2m",
        },
        "probes": {"scrape_interval": "1s", "health_interval": "1s"},
        "checks": {"every": "1s", "kinds": ["echo"]},  # the checks panel's data, per box
        # the simulated card is an H200: a limit above it, so that no VRAM alert fires
        "slo": {
            "vram_peak": "200GB",
            "error_ratio": 0.003,
            "server_error_ratio": 0.003,
            "ttft_p99": "2s",
            "e2e_p99": "30s",
            "jitter": 0.15,
        },
    }


def edge_config(
    node: str, site: str, hosts: dict[str, str], central: str, peers: list[str], rules: Path
) -> dict[str, Any]:
    """prometheus/prometheus.yml with the fleet snippet merged, as docs/deployment.md says,
    and what compose would expand: ${SOAKD_NODE}, ${SOAKD_SITE}, the hosts."""
    cfg = obs.local_prometheus_config(hosts, peers[0])
    snippet = obs.load_yaml(obs.CENTRAL_DIR / "edge-prometheus.snippet.yml")
    assert snippet["global"]["external_labels"] == {
        "node": "${SOAKD_NODE}",
        "site": "${SOAKD_SITE}",
    }
    cfg["global"]["external_labels"] = {"node": node, "site": site}
    (write, *_) = snippet["remote_write"]
    assert write["url"].endswith("/api/v1/write")
    cfg["remote_write"] = [write | {"url": f"{central}/api/v1/write"}]
    alerting = snippet["alerting"]
    alerting["alertmanagers"][0]["static_configs"][0]["targets"] = peers
    cfg["alerting"] = alerting
    cfg["rule_files"] = [str(rules / "*.yml")]
    return cfg


def central_config(peers: list[str], rules: Path) -> dict[str, Any]:
    cfg = obs.load_yaml(obs.CENTRAL_DIR / "prometheus.yml")
    assert cfg["rule_files"] == ["rules/*.yml"]
    cfg["rule_files"] = [str(rules / "*.yml")]
    cfg["global"]["evaluation_interval"] = "1s"  # the test's clock
    cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = peers
    return cfg


def federation_config(edges: dict[str, Site], workdir: Path) -> dict[str, Any]:
    """deploy/central/prometheus.federation.yml pulling the three edges, every
    FEDERATION_S: the shipped 30 s on the test's clock. Dashboards only: its alerts go
    nowhere (the remote-write central is the one under test for alerting)."""
    cfg = obs.load_yaml(obs.CENTRAL_DIR / "prometheus.federation.yml")
    assert cfg["global"]["scrape_interval"] == "30s"
    cfg["global"] |= {"scrape_interval": f"{FEDERATION_S}s", "scrape_timeout": "4s"}
    cfg.pop("alerting")
    cfg["rule_files"] = []
    (job,) = cfg["scrape_configs"]
    entries = [
        {
            "targets": [s.prometheus.url.removeprefix("http://")],
            "labels": {"node": n, "site": s.site},
        }
        for n, s in edges.items()
    ]
    (workdir / "edges.yml").write_text(yaml.safe_dump(entries))
    job["file_sd_configs"] = [{"files": [str(workdir / "edges.yml")]}]
    return cfg


def fleet_nodes(dest: Path) -> None:
    """rules/fleet-nodes.yml edited for this fleet, as its header asks."""
    doc = obs.load_yaml(obs.CENTRAL_DIR / "rules" / "fleet-nodes.yml")
    template = doc["groups"][0]["rules"][0]
    doc["groups"][0]["rules"] = [
        template | {"labels": {"node": node, "site": site}} for node, site in SITES
    ]
    (dest / "fleet-nodes.yml").write_text(yaml.safe_dump(doc, sort_keys=False))


def profile(node: str, **faults: float) -> Any:
    return get_profile("fast", decode_s_per_step=DECODE_S[node], **faults)


@contextlib.asynccontextmanager
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    obs.prometheus_bin()
    obs.alertmanager_bin()
    webhook = Webhook()
    async with contextlib.AsyncExitStack() as stack:
        app = web.Application()
        app.router.add_post("/alerts", webhook.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        site = web.TCPSite(runner, obs.HOST, 0)
        await site.start()
        hook_url = f"http://{obs.HOST}:{runner.addresses[0][1]}/alerts"

        # the Alertmanager cluster: three peers gossiping on 127.0.0.1
        gossip = [obs.free_port() for _ in range(3)]
        peers = []
        for i, port in enumerate(gossip):
            am = obs.alertmanager_daemon(
                hook_url,
                tmp_path,
                config=obs.CENTRAL_AM_CONFIG,
                name=f"alertmanager-{i + 1}",
                cluster=(port, [p for p in gossip if p != port]),
            )
            stack.push_async_callback(asyncio.to_thread, am.stop)
            peers.append(am)
        await asyncio.gather(*(asyncio.to_thread(am.start) for am in peers))
        peer_addrs = [am.url.removeprefix("http://") for am in peers]

        # the central Prometheus: remote_write receiver, the central rules
        central_dir = tmp_path / "central"
        rules = central_dir / "rules"
        obs.rules_with_for([obs.CENTRAL_DIR / "rules" / "central.yml"], rules, CENTRAL_WAITS)
        fleet_nodes(rules)
        central = obs.prometheus_daemon(
            central_config(peer_addrs, rules),
            central_dir,
            "--web.enable-remote-write-receiver",
            "--enable-feature=exemplar-storage",
        )
        stack.push_async_callback(asyncio.to_thread, central.stop)
        await asyncio.to_thread(central.start)

        # the sites: a simulator, soakd, an edge Prometheus each
        edge_rules = tmp_path / "edge-rules"
        obs.rules_with_for(obs.RULE_FILES, edge_rules, EDGE_WAITS)
        sites: dict[str, Site] = {}

        async def close_sims() -> None:
            for s in sites.values():
                if s.sim_open:
                    await s.sim.aclose()

        stack.push_async_callback(close_sims)
        for node, site_name in SITES:
            workdir = tmp_path / node
            workdir.mkdir()
            sim = await start_sim(obs.HOST, 0, profile(node), "m")
            config = workdir / "soak.yaml"
            config.write_text(yaml.safe_dump(soak_config(node, site_name, sim.url)))
            soakd_addr = f"{obs.HOST}:{obs.free_port()}"
            log = stack.enter_context((workdir / "soakd.out").open("wb"))
            soakd = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "soakd",
                "run",
                str(config),
                "--no-live",
                "--metrics-addr",
                soakd_addr,
                "--run-dir",
                str(workdir / "run"),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
            stack.push_async_callback(_stop_process, soakd)
            prom = obs.prometheus_daemon(
                edge_config(
                    node,
                    site_name,
                    {"soakd:9464": soakd_addr, "vllm:8000": sim.url.removeprefix("http://")},
                    central.url,
                    peer_addrs,
                    edge_rules,
                ),
                workdir,
                "--enable-feature=exemplar-storage",
            )
            stack.push_async_callback(asyncio.to_thread, prom.stop)
            sites[node] = Site(node, site_name, sim, sim.port, soakd, soakd_addr, prom)
        await asyncio.gather(*(asyncio.to_thread(s.prometheus.start) for s in sites.values()))

        # the other path, for the dashboards: a central Prometheus federating the edges
        federation_dir = tmp_path / "federation"
        federation_dir.mkdir()
        federation = obs.prometheus_daemon(federation_config(sites, federation_dir), federation_dir)
        stack.push_async_callback(asyncio.to_thread, federation.stop)
        await asyncio.to_thread(federation.start)
        http = await stack.enter_async_context(
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20))
        )
        yield Fleet(sites, central, federation, peers, webhook, http)


async def _stop_process(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


# --- the steps -------------------------------------------------------------------------------


async def _all_reporting(f: Fleet) -> None:
    """Every edge scrapes its soakd and its server; the central has every box's heartbeat."""

    async def ready() -> bool:
        for s in f.sites.values():
            up = {r["metric"]["job"]: r["value"][1] for r in await f.query(s.prometheus, "up")}
            if up != {"soakd": "1", "targets": "1"}:
                return False
        got = await f.query(f.central, 'up{job="soakd"} == 1')
        return {r["metric"]["node"] for r in got} == set(f.sites)

    await poll(ready, 90, "all three sites scraped and received centrally", every=0.5)

    async def history() -> bool:  # something to look at from before the incidents
        for s in f.sites.values():
            got = await f.query(s.prometheus, "count_over_time(soakd_requests_total[1m])")
            if max((float(r["value"][1]) for r in got), default=0) < 10:
                return False
        return True

    await poll(history, 60, "ten scrapes of counted requests at every site", every=0.5)


async def _peer_positions(f: Fleet) -> list[int]:
    """Each peer's place in the cluster's sending order (0 sends first, the others wait
    15 s each and send only what it did not): the sorted peer names."""

    async def settled() -> bool:
        for am in f.peers:
            async with f.http.get(am.url + "/api/v2/status") as resp:
                cluster = (await resp.json())["cluster"]
            if cluster.get("status") != "ready" or len(cluster.get("peers") or []) != 3:
                return False
        return True

    await poll(settled, 60, "the Alertmanager cluster settled with 3 peers", every=0.5)
    names = []
    for am in f.peers:
        async with f.http.get(am.url + "/api/v2/status") as resp:
            names.append((await resp.json())["cluster"]["name"])
    order = sorted(names)
    return [order.index(n) for n in names]


NFLOG_MERGED = "alertmanager_nflog_gossip_messages_propagated_total"
"""A peer's count of notification-log entries it learnt from the others by gossip."""


async def _nflog_merged(f: Fleet, am: obs.Daemon) -> float:
    async with f.http.get(am.url + "/metrics") as resp:
        text = await resp.text()
    (line,) = [x for x in text.splitlines() if x.startswith(NFLOG_MERGED + " ")]
    return float(line.split()[1])


async def _wait_page(f: Fleet, name: str, node: str, within: float) -> float:
    async def arrived() -> bool:
        return bool(f.webhook.firing(name, node))

    await poll(arrived, within, f"{name} for {node} at the webhook ({f.webhook.summary()})")
    return f.webhook.firing(name, node)[0]


async def _am_state(f: Fleet, name: str, node: str) -> str:
    for am in f.peers:
        if am.proc is None or am.proc.returncode is not None:
            continue
        async with f.http.get(am.url + "/api/v2/alerts") as resp:
            for alert in await resp.json():
                labels = alert["labels"]
                if labels.get("alertname") == name and labels.get("node") == node:
                    return str(alert["status"]["state"])
    return "absent"


async def incidents(f: Fleet) -> None:
    """Site A's server goes down; then the peer that sends is killed; then site B's server
    of the same name starts failing (5xx): B's page must arrive, once, A's TargetDown
    notwithstanding."""
    a, b = f.sites["edge-a"], f.sites["edge-b"]
    positions = await _peer_positions(f)
    sender = f.peers[positions.index(0)]
    others = [am for am in f.peers if am is not sender]
    before = [await _nflog_merged(f, am) for am in others]
    await a.sim.aclose()
    a.sim_open = False
    down = time.monotonic()
    t = await _wait_page(f, "TargetDown", "edge-a", TARGET_DOWN_WITHIN)
    f.figures["TargetDown edge-a, server stopped -> webhook (s)"] = round(t - down, 1)

    # The sender tells the other peers what it sent by gossip; killed before they heard,
    # the next in line would send again after its peer timeout (Alertmanager delivers
    # at least once). Kill it once they have heard: this is about the next page.
    async def heard() -> bool:  # an entry for every notification sent so far
        sent = len(f.webhook.received)
        now = [await _nflog_merged(f, am) for am in others]
        return all(n - b >= sent for n, b in zip(now, before, strict=True))

    await poll(heard, 30, "the other peers learning of the page by gossip", every=0.05)
    f.figures["the page known to every peer, after the webhook got it (s)"] = round(
        time.monotonic() - t, 2
    )
    assert sender.proc is not None
    sender.proc.kill()
    await asyncio.to_thread(sender.proc.wait)
    f.figures["killed peer"] = sender.name

    # site B's server is replaced by one answering 30 % of its requests with HTTP 500
    await b.sim.aclose()
    b.sim_open = False
    b.sim = await start_sim(obs.HOST, b.sim_port, profile("edge-b", error_rate=0.3), "m")
    b.sim_open = True
    failing = time.monotonic()
    t = await _wait_page(f, "ErrorRatioHigh", "edge-b", PAGE_WITHIN)
    f.figures["ErrorRatioHigh edge-b, 5xx begin -> webhook, sending peer killed (s)"] = round(
        t - failing, 1
    )
    # the cluster still holds A's TargetDown, and B's page is not suppressed by it
    assert await _am_state(f, "TargetDown", "edge-a") == "active"
    assert await _am_state(f, "ErrorRatioHigh", "edge-b") == "active"


async def _landed(f: Fleet, when: float, within: float = 60) -> None:
    """Until every box's heartbeat samples up to ``when`` are in the central."""

    async def landed() -> bool:
        got = await f.query(f.central, 'max by (node) (timestamp(up{job="soakd"}))')
        latest = {r["metric"]["node"]: float(r["value"][1]) for r in got}
        return set(latest) == set(f.sites) and min(latest.values()) >= when

    await poll(landed, within, f"every box's samples up to {when:.0f} centrally")


async def central_outage(f: Fleet) -> tuple[float, float]:
    """The central Prometheus stops for OUTAGE_S and comes back on the same storage; the
    edges' remote_write replays what it missed. Returns the outage's wall-clock bounds."""
    await asyncio.sleep(2)
    start = time.time()
    await asyncio.to_thread(f.central.stop)
    await asyncio.sleep(OUTAGE_S)
    await asyncio.to_thread(f.central.start)
    back = time.time()
    ready = time.monotonic()
    await _landed(f, back)  # the edges' replay: in order, so all of the outage is in
    f.figures["catch-up after the central came back (s)"] = round(time.monotonic() - ready, 1)
    return start, back


async def no_gap(f: Fleet, start: float, back: float) -> None:
    """Centrally, across the outage: the same heartbeat samples and the same counter
    increase as each edge holds itself."""
    t1, t2 = start - 5, back + 5
    window = f"{math.ceil(t2 - t1)}s"
    await _landed(f, t2 + 1)  # remote_write sends a batch at least every 5 s
    gaps, increases = {}, {}
    for node, s in f.sites.items():
        sel = f'node="{node}"'
        edge_n = await f.scalar(s.prometheus, f'count_over_time(up{{job="soakd"}}[{window}])', t2)
        central_n = await f.scalar(
            f.central, f'count_over_time(up{{job="soakd", {sel}}}[{window}])', t2
        )
        assert central_n == edge_n, (node, central_n, edge_n)
        # the same samples: the largest step between two is the edge's own (its scrape
        # interval, stretched by load), not a hole
        steps = []
        for prom, match in ((f.central, sel), (s.prometheus, "")):
            raw = await f.query(prom, f'up{{job="soakd", {match}}}[{window}]', t2)
            stamps = [float(ts) for ts, _ in raw[0]["values"]]
            steps.append(round(max(b - a for a, b in itertools.pairwise(stamps)), 3))
        assert steps[0] == steps[1], (node, "largest step central, edge", steps)
        gaps[node] = steps[0]
        # the last value scraped by then (a scrape that timed out marks the series stale
        # for a moment; last_over_time skips the marker, the same on both sides)
        total = "sum(last_over_time(soakd_requests_total{%s}[30s])) or vector(0)"
        edge_inc = await f.scalar(s.prometheus, total % "", t2) - await f.scalar(
            s.prometheus, total % "", t1
        )
        central_inc = await f.scalar(f.central, total % sel, t2) - await f.scalar(
            f.central, total % sel, t1
        )
        assert central_inc == edge_inc, (node, central_inc, edge_inc)
        # requests were counted meanwhile (fewer at site A: soakd backs off from a target
        # that fails every request)
        assert edge_inc > 0, (node, edge_inc)
        increases[node] = int(edge_inc)
    f.figures["largest step between heartbeat samples across the outage, centrally (s)"] = gaps
    f.figures["requests counted during the outage window, edge = central"] = increases


def _series_key(metric: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in metric.items() if k not in ("node", "site")))


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def may_be_empty(q: obs.PanelQuery) -> bool:
    return (
        JITTER_NEEDS in q.expr
        or q.description.startswith(NVML_ONLY)
        or GATEWAY_ROW in q.expr
        or q.expr.startswith(ALERT_LIST)
        or q.panel in obs.SIMULATED_RUN_EMPTY
    )


def rate_interval(time_interval_s: float, step_s: float) -> str:
    """Grafana's $__rate_interval for a datasource's timeInterval and a query's step."""
    return f"{max(4 * time_interval_s, step_s + time_interval_s):g}s"


async def _boxes_with_data(
    f: Fleet, prom: obs.Daemon, expr: str, since: float, step: float
) -> set[str]:
    result = await f.query_range(prom, expr, since, time.time(), step)
    return {
        r["metric"].get("node", "")
        for r in result
        if any(math.isfinite(float(v)) for _, v in r["values"])
    }


async def federated_dashboards(f: Fleet, since: float) -> None:
    """The same expressions against the federating Prometheus, at the step and
    $__rate_interval Grafana uses with timeInterval = its pull interval (what
    deploy/central/grafana/ says for federation): data for every box. With the edge's
    1 s instead, the rate() panels find at most one federated sample in their window."""
    missing, empty_at_1s = [], []
    for q in obs.dashboard_queries():
        if may_be_empty(q):
            continue
        for interval, misses in ((FEDERATION_S, missing), (1, empty_at_1s)):
            values = {
                "__rate_interval": rate_interval(interval, interval),
                "__interval": f"{interval}s",
            }
            expr = obs.expand_grafana(q.expr, values)
            if await _boxes_with_data(f, f.federation, expr, since, interval) != set(f.sites):
                misses.append(str(q))
    assert not missing, "federated: expressions without data for every box:\n" + "\n".join(missing)
    assert empty_at_1s, "timeInterval 1s on federated data should leave rate() panels empty"
    f.figures["federation: expressions lacking a box with timeInterval = the edge's 1 s"] = len(
        empty_at_1s
    )


async def dashboards(f: Fleet, since: float) -> None:
    """Every dashboard expression, "All" selected, against the central: data for every
    box, each series naming its node and site; and each box's share equal to what its
    own Prometheus answers for the same expression at the same instant."""
    end = time.time()
    queries = obs.dashboard_queries()
    with_data: dict[str, int] = dict.fromkeys(f.sites, 0)
    edge_data: dict[str, int] = dict.fromkeys(f.sites, 0)
    missing, merged, differ, allowed = [], [], [], []
    at = end - 15  # landed centrally for sure
    for q in queries:
        expr = obs.expand_grafana(q.expr)
        result = await f.query_range(f.central, expr, since, end)
        nodes = set()
        for series in result:
            labels = series["metric"]
            if "node" not in labels or "site" not in labels:
                merged.append(f"{q}: {labels}")
                continue
            if any(math.isfinite(float(v)) for _, v in series["values"]):
                nodes.add(labels["node"])
        for node in nodes & set(f.sites):
            with_data[node] += 1
        if nodes != set(f.sites):
            if may_be_empty(q):
                allowed.append(q)
                continue
            missing.append(f"{q}: data for {sorted(nodes)}")
        # the central's view of a box is the box's own view
        for node, s in f.sites.items():
            mine = obs.expand_grafana(q.expr, {"node": node, "site": s.site})
            central = {
                _series_key(r["metric"]): float(r["value"][1])
                for r in await f.query(f.central, mine, at)
            }
            edge = {
                _series_key(r["metric"]): float(r["value"][1])
                for r in await f.query(s.prometheus, expr, at)
            }
            if edge:
                edge_data[node] += 1
            same = set(central) == set(edge) and all(_close(central[k], edge[k]) for k in edge)
            if not same:
                differ.append(f"{q} at {node}: central {central} edge {edge}")
    assert not merged, "series without node/site centrally (merged):\n" + "\n".join(merged)
    assert not missing, "expressions without data for every box:\n" + "\n".join(missing)
    assert not differ, "the central's view of a box differs from the box's:\n" + "\n".join(differ)
    f.figures["dashboard expressions"] = len(queries)
    f.figures["expressions with data per box, centrally"] = with_data
    f.figures["expressions with data per box, on its edge (instant)"] = edge_data
    f.figures["empty for a box, as allowed (jitter, NVML only, gateway, alert list)"] = sorted(
        {f"{q.dashboard} / {q.panel}" for q in allowed}
    )
    for dashboard, query in obs.dashboard_variable_queries():
        selector, label = obs.label_values_query(query)
        async with f.http.get(
            f"{f.central.url}/api/v1/label/{label}/values",
            params={"match[]": obs.expand_grafana(selector)},
        ) as resp:
            values = set((await resp.json())["data"])
        if label == "node":
            assert values == set(f.sites), (dashboard, query, values)
        elif label == "site":
            assert values == {s for _, s in SITES}, (dashboard, query, values)
        else:
            assert values, (dashboard, query)


async def series_per_box(f: Fleet) -> None:
    """Per box, the central holds the edge's series, no more (its own list of boxes
    aside), no fewer."""
    at = time.time() - 5
    counts = {}
    for node, s in f.sites.items():
        edge = await f.scalar(s.prometheus, 'count({__name__=~".+"})', at)
        central = await f.scalar(
            f.central,
            f'count({{__name__=~".+", __name__!="node:soakd_expected:bool", node="{node}"}})',
            at,
        )
        assert central == edge, (node, central, edge)
        counts[node] = int(edge)
    f.figures["series per box, edge = central"] = counts


async def soakd_killed(f: Fleet) -> None:
    """soakd at site C dies: its edge pages SoakdDown, the central warns EdgeSoakdMissing,
    both for C only."""
    c = f.sites["edge-c"]
    c.soakd.kill()
    await c.soakd.wait()
    killed = time.monotonic()
    t = await _wait_page(f, "SoakdDown", "edge-c", PAGE_WITHIN)
    f.figures["SoakdDown edge-c, soakd killed -> webhook (s)"] = round(t - killed, 1)
    t = await _wait_page(f, "EdgeSoakdMissing", "edge-c", WARN_WITHIN)
    f.figures["EdgeSoakdMissing edge-c (central), soakd killed -> webhook (s)"] = round(
        t - killed, 1
    )


def check_notifications(f: Fleet) -> None:
    """Every alert names its box; none is notified twice in a row while it fires; the
    box-level pages are for the boxes they are about."""
    last: dict[str, str] = {}
    for _, alert in f.webhook.alerts():
        labels, summary = alert["labels"], alert["annotations"]["summary"]
        assert labels.get("node") in f.sites, alert
        assert labels.get("site") == f.sites[labels["node"]].site, alert
        assert labels["node"] in summary, summary
        assert labels["site"] in summary, summary
        if "target" in labels:
            assert labels["target"] in summary, summary
        fp = alert["fingerprint"]
        assert not (alert["status"] == "firing" and last.get(fp) == "firing"), (
            f"{labels['alertname']} on {labels['node']} notified twice: {f.webhook.summary()}"
        )
        last[fp] = alert["status"]
    for name, node in (
        ("TargetDown", "edge-a"),
        ("ErrorRatioHigh", "edge-b"),
        ("SoakdDown", "edge-c"),
        ("EdgeSoakdMissing", "edge-c"),
    ):
        nodes = {
            a["labels"]["node"] for _, a in f.webhook.alerts() if a["labels"]["alertname"] == name
        }
        assert nodes == {node}, (name, nodes)
        assert len(f.webhook.firing(name, node)) == 1, (name, f.webhook.summary())
    names = {a["labels"]["alertname"] for _, a in f.webhook.alerts()}
    assert "EdgeUnreachable" not in names, "a box called unreachable, none was"
    f.figures["notifications (alerts) received"] = len(f.webhook.alerts())


async def test_a_fleet_of_three_sites(tmp_path: Path) -> None:
    started = time.monotonic()
    async with fleet(tmp_path) as f:
        await _all_reporting(f)
        since = time.time()
        f.figures["fleet up (s)"] = round(time.monotonic() - started, 1)
        _, (start, back) = await asyncio.gather(incidents(f), central_outage(f))
        await no_gap(f, start, back)
        await dashboards(f, since)
        await federated_dashboards(f, since)
        await series_per_box(f)
        await soakd_killed(f)
        check_notifications(f)
    # the three runs, side by side: the same plan on three boxes (soakd report --fleet)
    fr = await asyncio.to_thread(build_fleet, [tmp_path / node / "run" for node, _ in SITES])
    verdicts = {b.node: b.passed for b in fr.boxes}
    assert verdicts["edge-a"] is False  # its server went away: transport errors
    assert verdicts["edge-b"] is False  # 30 % 5xx
    ranks = {False: 0, None: 1, True: 2}
    assert [ranks[b.passed] for b in fr.boxes] == sorted(ranks[b.passed] for b in fr.boxes)
    assert {b.node: b.site for b in fr.boxes} == dict(SITES)
    f.figures["soakd report --fleet"] = [f"{b.node}: {b.passed}" for b in fr.boxes]
    f.figures["whole rehearsal (s)"] = round(time.monotonic() - started, 1)
    print("\nfleet rehearsal:")
    for what, value in f.figures.items():
        print(f"  {what}: {value}")
