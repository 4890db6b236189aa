"""Live view: what a terminal shows while soakd runs, and the summary table at the end."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from soakd.config import format_duration


def _f(value: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def target_table(rows: dict[str, dict[str, Any]], title: str) -> Table:
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("target", style="bold")
    for col in ("req/s", "tok/s", "ok", "errors", "goodput", "TTFT p50", "TTFT p99", "E2E p50",
                "E2E p99", "ITL p50", "lag p99"):
        table.add_column(col, justify="right")
    for name, r in rows.items():
        errors = r["errors"]
        goodput = r.get("goodput")  # share of sent requests within every SLO (soakd/goodput.py)
        table.add_row(
            name, _f(r["rps"], "{:.2f}"), _f(r["output_tps"], "{:.1f}"), str(r["ok"]),
            Text(str(errors), style="red" if errors else ""),
            _f(None if goodput is None else goodput * 100, "{:.1f} %"),
            _f(r["ttft_p50_ms"], "{:.0f} ms"), _f(r["ttft_p99_ms"], "{:.0f} ms"),
            _f(r["e2e_p50_ms"], "{:.0f} ms"), _f(r["e2e_p99_ms"], "{:.0f} ms"),
            _f(r["itl_p50_ms"], "{:.1f} ms"), _f(r["lag_p99_ms"], "{:.1f} ms"),
        )
    return table


def live_panel(status: dict[str, Any]) -> Group:
    phase = status.get("phase") or "-"
    head = Text.assemble(
        ("soakd ", "bold"), (status["run_id"], "cyan"), "  phase ", (phase, "bold yellow"),
        f"  elapsed {format_duration(round(status['elapsed_s']))}",
        f"  remaining {format_duration(round(status['remaining_s']))}",
        f"  in flight {sum(status['in_flight'].values())}",
        f"  metrics {status['metrics_url']}/metrics",
    )
    return Group(head, target_table(status["targets"], "last 60 s"))


def errors_table(rows: dict[str, dict[str, Any]]) -> Table | None:
    kinds = sorted({k for r in rows.values() for k in r.get("errors_by_kind", {})})
    if not kinds:
        return None
    table = Table(title="errors by kind", title_justify="left")
    table.add_column("target", style="bold")
    for kind in kinds:
        table.add_column(kind, justify="right")
    for name, r in rows.items():
        table.add_row(name, *(str(r["errors_by_kind"].get(k, 0)) for k in kinds))
    return table
