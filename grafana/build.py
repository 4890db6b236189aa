"""Build soakd's Grafana dashboards: ``python grafana/build.py`` writes grafana/dashboards/.

The JSON files are committed; ``python grafana/build.py --check`` fails when they differ
from what this file builds (tests/unit/test_observability_static.py runs it). Edit the
Python, not the JSON: grafana/panels.py holds the queries, panels, grid layout and template
variables; grafana/dash_<name>.py builds one dashboard each; this file writes them all.

Every query uses the metric names of docs/metrics.md (soakd_*), the recording rules of
prometheus/rules/soakd-recording.yml (target:*, gpu:*, instance:*), or the few target-side
vLLM names listed in prometheus/external-metrics.txt. Panels filter on the ``$site``,
``$node``, ``$target`` and ``$gpu`` template variables and keep node and site apart, so the
same dashboards serve one edge box and a central Prometheus of many (docs/alerting.md).
Only the Python standard library is used.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script (python grafana/build.py): grafana/ is first
    sys.path.insert(0, str(ROOT))

from grafana import (  # noqa: E402
    dash_fleet,
    dash_gpu,
    dash_latency,
    dash_overview,
    dash_server,
    dash_targets,
)

OUT = Path(__file__).resolve().parent / "dashboards"

DASHBOARDS = (
    dash_fleet.fleet,
    dash_overview.overview,
    dash_latency.latency,
    dash_gpu.gpu,
    dash_server.server,
    dash_targets.targets,
)


def build() -> dict[str, str]:
    """File name -> JSON text, for every dashboard."""
    out = {}
    for make in DASHBOARDS:
        dash = make().to_json()
        out[f"{dash['uid']}.json"] = json.dumps(dash, indent=2, sort_keys=True) + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the committed JSON differs from this build"
    )
    args = parser.parse_args(argv)
    built = build()
    if args.check:
        stale = sorted(
            name
            for name, text in built.items()
            if not (OUT / name).is_file() or (OUT / name).read_text() != text
        )
        extra = sorted(p.name for p in OUT.glob("*.json") if p.name not in built)
        for name in stale:
            print(
                f"grafana/dashboards/{name} is stale: run python grafana/build.py", file=sys.stderr
            )
        for name in extra:
            print(f"grafana/dashboards/{name} is not built by grafana/build.py", file=sys.stderr)
        return 1 if stale or extra else 0
    OUT.mkdir(exist_ok=True)
    for name, text in built.items():
        (OUT / name).write_text(text)
        print(f"wrote grafana/dashboards/{name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
