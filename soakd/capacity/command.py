"""Capacity room, ``soakd capacity CONFIG``'s body: sweep, print the curves and the
knees, write the JSON; ``--check``: exit 1 when a knee is below its floor."""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from soakd.capacity.result import CapacityResult, StepPoint, curve_table, knee_text
from soakd.capacity.shares import RESULT_FILE
from soakd.capacity.sweep import sweep
from soakd.config import Config, ConfigError, load_config
from soakd.logs import close_logging, setup_logging
from soakd.report.capacity import capacity_page

EXIT_BELOW_FLOOR = 1


def default_dir(cfg: Config) -> Path:
    return Path("runs") / f"{cfg.run.name}-capacity-{datetime.now(UTC):%Y%m%d-%H%M%S}"


def run_capacity(args: argparse.Namespace) -> int:
    """The command: exit 0, or 1 with ``--check`` when a knee is below its floor."""
    cfg = load_config(args.config)
    problem = cfg.capacity_problem()
    if problem:
        raise ConfigError(problem)
    run_dir: Path = args.run_dir or default_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    setup_logging(
        cfg.logging.level, cfg.logging.format, log_file=run_dir / "soakd.log", console=False
    )
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160)

    def shown(target: str, p: StepPoint) -> None:
        verdict = "held" if p.passed else f"failed: {p.limit}"
        console.print(f"{target} step {p.step}: {p.load:.3g} -> {verdict}")

    try:
        result = asyncio.run(
            sweep(
                cfg,
                run_dir,
                by=args.by,
                max_time_s=args.max_time,
                metrics_addr=args.metrics_addr,
                on_step=shown,
            )
        )
    finally:
        close_logging()
    result.write(run_dir / RESULT_FILE)
    (run_dir / "capacity.html").write_text(capacity_page(result.doc()))
    if args.out is not None:
        result.write(args.out)
    return print_result(result, console, check=args.check, where=args.out or run_dir / RESULT_FILE)


def print_result(result: CapacityResult, console: Console, *, check: bool, where: Path) -> int:
    for knee in result.targets.values():
        console.print(curve_table(knee))
    for knee in result.targets.values():
        console.print(knee_text(knee))
    console.print(f"capacity sweep took {result.seconds:.0f} s (bound {result.max_time_s:g} s)")
    console.print(f"result: {where}")
    low = [k for k in result.targets.values() if k.below_floor]
    for k in low:
        console.print(
            f"FAIL {k.target}: knee {k.knee if k.knee is not None else 'none'} is below "
            f"capacity.floor.{k.target} ({k.floor:g})"
        )
    return EXIT_BELOW_FLOOR if check and low else 0
