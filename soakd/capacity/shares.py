"""Capacity room, plans relative to capacity: a load written as a share of the knee
(``rate: 70%``) resolved before the plan is built, from ``capacity.result`` (a file
``soakd capacity`` wrote, or its directory) or from a sweep run then
(``capacity.measure: true``; docs/capacity.md)."""

from __future__ import annotations

import asyncio
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from soakd.capacity.result import read_result
from soakd.capacity.sweep import sweep
from soakd.config import CapacityConfig, Config
from soakd.run.session import SweepHook

RESULT_FILE = "capacity.json"


def from_result(cfg: Config) -> Config:
    """``cfg`` with its shares resolved from ``capacity.result`` (ConfigError, one line,
    when the file cannot be read or lacks a target's knee)."""
    cap = cfg.capacity or CapacityConfig()
    assert cap.result is not None
    return cfg.with_knees(read_result(cap.result), f"capacity.result {cap.result}")


async def resolve_shares(
    cfg: Config, sweep_dir: Path, metrics_addr: str | None = None
) -> tuple[Config, Path | None]:
    """``cfg`` with every share of the knee resolved, and the result file it resolved
    against: ``capacity.result`` when set, else a sweep run now into ``sweep_dir`` (its
    exporter on ``metrics_addr``, else ``exporter.listen``, as the run's). Without
    shares: ``cfg`` and None."""
    if not cfg.shares:
        return cfg, None
    cap = cfg.capacity or CapacityConfig()
    if cap.result is not None:
        file = cap.result / RESULT_FILE if cap.result.is_dir() else cap.result
        return from_result(cfg), file
    result = await sweep(cfg, sweep_dir, metrics_addr=metrics_addr)
    result.write(sweep_dir / RESULT_FILE)
    knees = read_result(sweep_dir / RESULT_FILE, "capacity.measure")
    return cfg.with_knees(knees, f"the sweep in {sweep_dir}"), sweep_dir / RESULT_FILE


def share_lines(cfg: Config) -> list[str]:
    """One line per share: ``phase steady, cap-4: rate 70% of the knee 12 req/s = 8.4
    req/s``."""
    return [
        f"phase {phase}, {target}: {text}"
        for phase, by_target in cfg.share_texts().items()
        for target, text in by_target.items()
    ]


@dataclass(frozen=True)
class ForRun:
    """What ``soakd run`` takes from capacity: the config with its shares resolved, the
    result they resolved against, and the hook of its ``mode: sweep`` phases."""

    cfg: Config
    knees: Path | None
    on_sweep: SweepHook | None

    def keep(self, run_dir: Path) -> None:
        """The result the shares resolved against, as the run dir's ``capacity.json`` (the
        report draws its curve)."""
        if self.knees is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.knees, run_dir / RESULT_FILE)


def for_run(cfg: Config, metrics_addr: str | None) -> ForRun:
    """Resolve ``cfg``'s shares (a sweep first with ``capacity.measure``: its steps on
    ``metrics_addr``), say what each resolved to on stderr, and hook its sweep phases."""
    from soakd.capacity.command import default_dir
    from soakd.capacity.phases import phase_hook

    resolved, knees = asyncio.run(resolve_shares(cfg, default_dir(cfg), metrics_addr))
    for line in share_lines(resolved):
        print(f"soakd: {line}", file=sys.stderr)
    return ForRun(resolved, knees, phase_hook(resolved) if resolved.sweeps else None)
