"""Live view: what a terminal shows while soakd runs, and the summary table at the end.

It fits the terminal: columns are dropped by priority until the table fits (80 columns
keep the target, its successes per second, errors and error ratio, goodput and the P99s;
120 add tokens/s, sends not made and attempts). The head says the phase (n of N), the
time done and left; a value past the target's SLO is marked "!" (and red); the most
frequent error of each failing target is named under the table; once stopping, it says a
second Ctrl-C stops at once. Latencies use the one unit rule of every soakd surface
(``fmt_ms``: ms below a second, s above); counts and ratios as soakd/measure/goodput.py counts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from soakd.config import format_duration, slo
from soakd.measure.analysis import fmt_ms
from soakd.model import MissReason

if TYPE_CHECKING:
    from soakd.run.status import GpuNow, Status
    from soakd.workload.failing import FailingNow
    from soakd.workload.sizing import PromptTokens

Row = Mapping[str, object]
"""A target's row: ``analysis.RecentRow`` (/status) or ``analysis.SessionRow`` (the end of
a run), with ``missed`` added; a key a row lacks shows as "-"."""


def _float(r: Row, key: str) -> float | None:
    value = r.get(key)
    return float(value) if isinstance(value, int | float) else None


def _num(fmt: str, key: str) -> Callable[[Row], str]:
    return lambda r: "-" if r.get(key) is None else fmt.format(r[key])


def _pct(key: str) -> Callable[[Row], str]:
    return lambda r: "-" if (v := _float(r, key)) is None else f"{v * 100:.1f} %"


def _ratio(key: str) -> Callable[[Row], str]:
    """An error ratio: never "0.0 %" above zero (0.035 %), whole percent from 10 %."""

    def text(r: Row) -> str:
        v = _float(r, key)
        if v is None:
            return "-"
        pct = v * 100
        return "0 %" if pct == 0 else f"{pct:.2g} %" if pct < 10 else f"{pct:.0f} %"

    return text


def _lat(key: str) -> Callable[[Row], str]:
    return lambda r: fmt_ms(_float(r, key))


def _kinds(r: Row) -> Mapping[str, int]:
    kinds = r.get("errors_by_kind")
    return kinds if isinstance(kinds, dict) else {}


COLUMNS: list[tuple[str, Callable[[Row], str]]] = [
    # in priority order: the first ones stay on the narrowest terminal
    ("ok/s", _num("{:.2f}", "rps")),  # successes per second
    ("errors", _num("{}", "errors")),
    ("err %", _ratio("error_ratio")),
    ("goodput", _pct("goodput")),  # share sent within every SLO (goodput.py)
    ("TTFT p99", _lat("ttft_p99_ms")),
    ("E2E p99", _lat("e2e_p99_ms")),
    ("tok/s", _num("{:.1f}", "output_tps")),
    ("not sent", _num("{}", "missed")),
    ("sent/s", _num("{:.2f}", "attempt_rps")),  # every request sent, whatever became of it
    ("lag p99", _lat("lag_p99_ms")),
    ("shed", _num("{}", "shed")),
    ("TTFT p50", _lat("ttft_p50_ms")),
    ("E2E p50", _lat("e2e_p50_ms")),
    ("ITL p50", _lat("itl_p50_ms")),
    ("ok", _num("{}", "ok")),
]
SHOWN_ORDER = (
    "ok/s",
    "sent/s",
    "tok/s",
    "ok",
    "errors",
    "err %",
    "goodput",
    "shed",
    "not sent",
    "TTFT p50",
    "TTFT p99",
    "E2E p50",
    "E2E p99",
    "ITL p50",
    "lag p99",
)
SLO_COLUMNS = {
    "TTFT p99": ("ttft_p99_ms", "ttft_p99", 1000.0),
    "E2E p99": ("e2e_p99_ms", "e2e_p99", 1000.0),
    "err %": ("error_ratio", "error_ratio", 1.0),
}
"""Columns with an SLO: (row key, slo key, slo -> row unit); a value past it is breached."""
BREACH = "!"

Slos = Mapping[str, Mapping[str, float]]
"""Per target, its SLO (``Slo.model_dump(exclude_none=True)``, overrides applied)."""


def breached(r: Row, col: str, slo: Mapping[str, float]) -> bool:
    key, limit_key, factor = SLO_COLUMNS[col]
    value, limit = _float(r, key), slo.get(limit_key)
    return value is not None and limit is not None and value > limit * factor


def target_table(
    rows: Mapping[str, Row], title: str, width: int | None = None, slos: Slos | None = None
) -> Table:
    """One line per target; with ``width``, only the columns (by priority) that fit; a value
    past the target's SLO marked ``!`` and red."""
    slos = slos or {}
    cells = {name: {title_: fn(r) for title_, fn in COLUMNS} for name, r in rows.items()}
    for name, r in rows.items():
        for col in SLO_COLUMNS:
            if breached(r, col, slos.get(name, {})):
                cells[name][col] += BREACH
    name_w = max([len("target"), *(len(n) for n in rows)])
    keep: list[str] = []
    used = name_w + 4  # the borders and the target column's padding
    for col, _ in COLUMNS:
        w = max([len(col), *(len(c[col]) for c in cells.values())]) + 3
        if width is not None and used + w > width:
            continue
        keep.append(col)
        used += w
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("target", style="bold", no_wrap=True)
    shown = [c for c in SHOWN_ORDER if c in keep]
    for col in shown:
        table.add_column(col, justify="right", no_wrap=True)
    for name in rows:
        out = []
        for col in shown:
            text = cells[name][col]
            alarm = text.endswith(BREACH) or (
                col in ("errors", "not sent") and text not in ("0", "-")
            )
            out.append(
                Text(text, style="bold red" if text.endswith(BREACH) else "red" if alarm else "")
            )
        table.add_row(name, *out)
    return table


def client_limited(status: Status) -> list[str]:
    """Targets whose schedule soakd itself could not keep (lag past the limit, sends made
    too late to count): their figures measure the client (``slo.client_limited``)."""
    return [
        name
        for name, r in status.targets.items()
        if slo.client_limited(
            r["lag_p99_ms"],
            status.missed.get(name, {}).get(MissReason.LATE, 0),
            status.lag_limit_s,
        )
    ]


def live_panel(status: Status, width: int | None = None) -> Group:
    elapsed, left = status.elapsed_s, status.remaining_s
    phase, style = status.phase or "-", "bold yellow"
    if status.phase_index is not None and status.phases:
        phase += f" {status.phase_index + 1}/{status.phases}"
    if status.stopping:
        phase, style = "draining", "bold magenta"
    head = Text.assemble(
        ("soakd ", "bold"),
        (status.run_id, "cyan"),
        "  ",
        (phase, style),
        f"  {format_duration(round(elapsed))} / {format_duration(round(elapsed + left))}",
        "" if status.stopping else f", {format_duration(round(left))} left",
    )
    rows: dict[str, Row] = {
        name: {**r, "missed": sum(status.missed.get(name, {}).values())}
        for name, r in status.targets.items()
    }
    parts: list[RenderableType] = [head, _links(status)]
    if status.stopping:
        parts.append(
            Text(
                "stopping: finishing what is in flight (up to "
                f"{format_duration(status.drain_timeout_s or 0)}); "
                "Ctrl-C again stops at once",
                style="bold magenta",
            )
        )
    limited = client_limited(status)
    if limited:
        parts.append(
            Text(f"CLIENT-LIMITED {', '.join(limited)}: soakd is behind the plan", style="bold red")
        )
    parts += [_failing_line(name, f) for name, f in status.failing.items()]
    parts.append(
        target_table(rows, "last 60 s (not sent: this session; ! past the SLO)", width, status.slo)
    )
    parts += _error_lines(rows)
    prompts = prompt_line(status.prompt_tokens)
    if prompts is not None:
        parts.append(prompts)
    parts += [_vram_line(v) for v in status.vram]
    return Group(*parts)


ERROR_HINTS = {
    "http_auth": "401/403: the API key",
    "http_4xx": "4xx: the model name or the request",
    "http_429": "429: rate limited",
    "http_5xx": "5xx: the server",
    "connect_refused": "nothing listening at base_url",
    "connect_error": "DNS, TLS or network",
    "timeout_connect": "no connection in timeouts.connect",
    "timeout_ttft": "no first token in timeouts.ttft",
    "timeout_idle": "the stream went silent",
    "timeout_total": "over timeouts.total",
    "bad_response": "not an answer soakd can read",
}
"""What the most frequent error of a target most likely means (docs/metrics.md)."""


def _error_lines(rows: Mapping[str, Row]) -> list[Text]:
    """Under the table, per target with errors in the window: its most frequent kind."""
    out = []
    for name, r in rows.items():
        top = r.get("top_error")
        if not isinstance(top, str) or not r.get("errors"):
            continue
        hint = ERROR_HINTS.get(top)
        out.append(
            Text.assemble(
                (f"{name}: ", "bold"), (top, "red"), f" ({hint})" if hint else "", " most often"
            )
        )
    return out


def prompt_line(info: PromptTokens | None) -> Text | None:
    """prompt tokens, planned -> served: vllm 300 -> 299, sim 300 -> 146 (-51.3 %); a
    target off by more than 10 % in red. Served: the answers' usage this session, else the
    target's own count at start (marked)."""
    from soakd.workload.sizing import WARN_SHARE

    if info is None:
        return None
    line = Text("prompt tokens, planned -> served:", style="dim")
    shown = 0
    for name, r in info.targets.items():
        planned, served, start = r.planned, r.served, r.at_start
        if served is None and start is not None:
            planned, served = info.planned, start
        if planned is None or served is None or planned <= 0:
            continue
        off = served / planned - 1.0
        mark = " at start" if r.served is None else ""
        text = f" {name} {planned:,.0f} -> {served:,.0f}{mark}"
        if abs(off) > WARN_SHARE:
            line.append(text + f" ({off * 100:+.1f} %)", "bold red")
        else:
            line.append(text)
        shown += 1
    return line if shown else None


def _links(status: Status) -> Text:
    """Where the metrics are, and (with sender processes) how many are up: in red when
    one is down (it is being restarted; what it held is counted as worker_lost)."""
    line = Text(f"in flight {sum(status.in_flight.values())}  ", style="dim")
    line.append(f"metrics {status.metrics_url}/metrics", "dim")
    workers = status.workers
    if workers:
        up = sum(1 for w in workers if w.up)
        line.append(
            f"  workers {up}/{len(workers)} up", "dim" if up == len(workers) else "bold red"
        )
    return line


def _failing_line(name: str, f: FailingNow) -> Text:
    """PAUSED cloud: every request failed: http_auth (http 401); next request in 12 s."""
    detail = f" ({f.detail})" if f.detail else ""
    when = f.next_probe_s or 0
    then = f"next request in {when:.0f} s" if when else "one request out"
    return Text(f"PAUSED {name}: every request failed: {f.cause}{detail}; {then}", style="bold red")


def _vram_line(v: GpuNow) -> Text:
    """GPU 0 (edge-4gb): VRAM 3.62 GB, peak 3.92 GB, line 3.90 GB ABOVE (decimal GB)."""

    def gb(x: float | None) -> str:
        return "-" if x is None else f"{x / 1e9:.2f} GB"

    used, peak, limit = v.used_bytes, v.peak_bytes, v.limit_bytes
    whose = f" ({v.target})" if v.target else ""
    text = f"GPU {v.gpu}{whose}: VRAM {gb(used)}, peak {gb(peak)}"
    if limit is None:
        return Text(text)
    above = used is not None and used > limit
    return Text.assemble(
        text,
        f", line {gb(limit)}",
        (" ABOVE" if above else "", "bold red"),
        (" peak over" if not above and (peak or 0) > limit else "", "yellow"),
    )


def errors_table(rows: Mapping[str, Row]) -> Table | None:
    kinds = sorted({k for r in rows.values() for k in _kinds(r)})
    if not kinds:
        return None
    table = Table(title="errors by kind", title_justify="left")
    table.add_column("target", style="bold")
    for kind in kinds:
        table.add_column(kind, justify="right")
    for name, r in rows.items():
        table.add_row(name, *(str(_kinds(r).get(k, 0)) for k in kinds))
    return table
