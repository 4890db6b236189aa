"""Report room, output: the JSON rendering, and build-render-write in one call."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from soakd.report.build import build_report
from soakd.report.html import render_html
from soakd.report.markdown import render_markdown
from soakd.report.model import METRIC_COLUMNS, Report


def render_json(rep: Report) -> str:
    """The ``Report`` as it is (``asdict``: the dataclasses' fields are the keys), and the
    metric columns."""
    doc = asdict(rep)
    if doc["capacity"] is None:  # a run with no share of the knee: the document as before
        del doc["capacity"]
    doc["columns"] = [{"key": k, "title": t, "better": b} for k, t, b in METRIC_COLUMNS]
    return json.dumps(doc, indent=2, default=str) + "\n"


RENDERERS: dict[str, Callable[[Report], str]] = {
    "md": render_markdown,
    "html": render_html,
    "json": render_json,
}


def write_report(
    run_dir: Path, fmt: str, out: Path | None, energy_price_per_kwh: float | None = None
) -> str:
    """Build and render; writes ``out`` atomically when given, returns the text."""
    rep = build_report(run_dir, energy_price_per_kwh=energy_price_per_kwh)
    return write_built(rep, fmt, out)


def write_built(rep: Report, fmt: str, out: Path | None) -> str:
    """Render a built report; writes ``out`` atomically when given, returns the text."""
    text = RENDERERS[fmt](rep)
    if out is not None:
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out)
    return text
