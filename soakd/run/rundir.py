"""Run directory room: the run's id, the files soakd writes beside the journal (the
effective config, the plan, the summary), and the open-file limit its sockets need.

Called by the composition root (``app.py``) before the journal opens and after it closes.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog
import yaml

from soakd.config import Config, ConfigError
from soakd.config.redact import config_doc
from soakd.model import Plan
from soakd.workload.plan import describe_plan

log = structlog.get_logger()

FD_RESERVE = 256  # files beyond the requests: the journal, logs, probes, the exporter


def new_run_id(name: str) -> str:
    return f"{name}-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def raise_fd_limit(plan: Plan) -> None:
    """Every request in flight holds a socket: make sure the open-file limit allows the
    busiest phase (raising the soft limit up to the hard one), or say so before the run."""
    need = FD_RESERVE + max(
        (sum(s.fd_need for s in phase.loads.values()) for phase in plan.phases),
        default=0,
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise ConfigError(
                f"the busiest phase can hold {need - FD_RESERVE} requests open, and this "
                f"process may open only {hard} files (hard limit): raise it (ulimit -n, "
                "LimitNOFILE= in the systemd unit, ulimits in compose) or lower the "
                "concurrency / max_in_flight / max_connections"
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def prepare_dir(run_dir: Path, cfg: Config, plan: Plan) -> None:
    """The run dir, with the effective config (the redacted copy the journal keeps) and
    the plan as ``soakd check`` prints it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    effective = config_doc(cfg)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(effective, sort_keys=False))
    (run_dir / "plan.txt").write_text(describe_plan(plan, cfg) + "\n")


def write_summary(run_dir: Path, doc: dict[str, Any]) -> None:
    """``summary.json``, replaced whole. A full disk at the end is one log line: the
    journal and the metrics have the numbers."""
    tmp = run_dir / "summary.json.tmp"
    try:
        tmp.write_text(json.dumps(doc, indent=2, default=str))
        os.replace(tmp, run_dir / "summary.json")
    except OSError as exc:
        log.error(  # noqa: TRY400 (one line: the cause is known, no traceback)
            "summary_write_failed", error=f"{type(exc).__name__}: {exc.strerror}"
        )
        with contextlib.suppress(OSError):
            tmp.unlink()
