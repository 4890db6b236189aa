"""Report room, capacity: the throughput-latency curve of a ``soakd capacity`` sweep (its
JSON, as docs/capacity.md lists the fields), and the notes on loads written as a share of
the knee. The run dir's ``capacity.json`` is the result the run's shares resolved
against; ``soakd capacity`` draws the same section into its own ``capacity.html``."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from soakd.config import Load
from soakd.report.html import svg_chart
from soakd.report.model import Series

CAPACITY_FILE = "capacity.json"


def read_capacity(run_dir: Path) -> dict[str, Any] | None:
    """The run dir's capacity result (None: none, or not one soakd wrote)."""
    try:
        doc = json.loads((run_dir / CAPACITY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("targets"), dict) else None


def share_notes(config_document: Mapping[str, Any]) -> list[str]:
    """``phase steady, cap-4: rate 70% of the knee 13 req/s = 9.1 req/s`` per load the
    stored config holds as a share of the knee (resolved per target before the run)."""
    out = []
    for phase in config_document.get("phases") or []:
        if not isinstance(phase, dict):
            continue
        for target, raw in (phase.get("targets") or {}).items():
            try:
                text = Load.model_validate(raw).share_text()
            except ValueError:  # an older or foreign load: no share to tell
                continue
            if text:
                out.append(
                    f"load as a share of the knee: phase {phase.get('name')}, {target}: {text}"
                )
    return out


def sweep_notes(run_dir: Path) -> list[str]:
    """The ``mode: sweep`` phases' knees (``capacity-NNNN.json``: soakd/capacity/phases.py),
    each, then each target's drift from the first to the last: ``the knee of cap-32 fell
    from 26 to 21 req/s between hour 0 and hour 48 (-19 %)``."""
    sweeps = []
    for path in sorted(run_dir.glob("capacity-[0-9]*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("targets"), dict):
            sweeps.append(doc)
    notes = []
    series: dict[str, list[tuple[float, float, str]]] = {}
    for doc in sweeps:
        hour = (_num(doc.get("plan_offset_s")) or 0.0) / 3600
        phase = doc.get("phase")
        for name, t in doc["targets"].items():
            notes.append(
                f"capacity sweep (phase {phase}, its requests in no other figure), hour "
                f"{hour:.3g}: {knee_line(name, t)}"
            )
            knee = _num(t.get("knee"))
            if knee is not None:
                series.setdefault(name, []).append((hour, knee, str(t.get("by"))))
    for name, points in series.items():
        if len(points) < 2:
            continue
        (h0, k0, by), (h1, k1, _) = points[0], points[-1]
        unit = " req/s" if by == "rate" else " concurrent"
        moved = "fell" if k1 < k0 else "rose" if k1 > k0 else "stayed"
        notes.append(
            f"the knee of {name} {moved} from {k0:.4g} to {k1:.4g}{unit} between hour "
            f"{h0:.3g} and hour {h1:.3g} ({(k1 - k0) / k0:+.0%})"
        )
    return notes


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) else None


def _points(steps: list[dict[str, Any]], key: str) -> list[tuple[float, float | None]]:
    """(achieved req/s, the step's ``key``), in order of the achieved rate."""
    pts = [(_num(s.get("achieved_rps")) or 0.0, _num(s.get(key))) for s in steps]
    return sorted(pts, key=lambda p: p[0])


def knee_line(name: str, t: dict[str, Any]) -> str:
    knee = _num(t.get("knee"))
    unit = " req/s" if t.get("by") == "rate" else " concurrent"
    said = "none held" if knee is None else f"{knee:.4g}{unit}"
    return f"{name}: knee {said}, limited by {t.get('limit') or '-'} ({t.get('ended', '')})"


def capacity_html(doc: dict[str, Any]) -> str:
    """A section: per target, P50/P99 TTFT and E2E against the achieved rate, each step a
    point (the knee's step marked), and the knee in words."""
    e = html.escape
    parts = ["<h2>Capacity: latency against throughput</h2>", '<ul class="notes">']
    targets: dict[str, Any] = doc["targets"]
    parts += [f"<li>{e(knee_line(name, t))}</li>" for name, t in targets.items()]
    parts.append('</ul><div class="plots">')
    for name, t in targets.items():
        steps = [s for s in t.get("steps", []) if isinstance(s, dict)]
        series = [
            Series("E2E p99", _points(steps, "e2e_p99_ms"), "e2e"),
            Series("E2E p50", _points(steps, "e2e_p50_ms"), "e2e", dashed=True),
            Series("TTFT p99", _points(steps, "ttft_p99_ms"), "ttft"),
            Series("TTFT p50", _points(steps, "ttft_p50_ms"), "ttft", dashed=True),
        ]
        knee = _num(t.get("knee"))
        at = [s for s in steps if knee is not None and _num(s.get("load")) == knee]
        markers = [(_num(at[0].get("achieved_rps")) or 0.0, "knee")] if at else []
        parts.append(svg_chart(name, "ms", series, markers, x_label="achieved req/s"))
    parts.append("</div>")
    return "\n".join(parts)


def capacity_page(doc: dict[str, Any]) -> str:
    """``capacity.html``: the section on a page of its own."""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        "<title>soakd capacity</title></head><body>\n" + capacity_html(doc) + "\n</body></html>\n"
    )
