"""CLI: parse, call, print. ``soakd run | check | sim``. Exit 2 on bad input, one line each."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

from soakd import __version__
from soakd.config import ConfigError, load_config, parse_duration

EXIT_USAGE = 2


def _duration(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be above zero, got {text!r}")
    return seconds


def _addr(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="soakd", description="Multi-day soak tests for LLM inference servers.")
    parser.add_argument("--version", action="version", version=f"soakd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a soak test from a config file")
    run.add_argument("config", type=Path)
    run.add_argument("--duration", type=_duration, metavar="D",
                     help="cap the run (e.g. 10m, 72h); the plan is cut there")
    run.add_argument("--rehearse", type=_duration, metavar="D",
                     help="compress the whole plan into D (e.g. 5m) to try a config")
    run.add_argument("--metrics-addr", type=_addr, metavar="HOST:PORT",
                     help="where /metrics and /status listen (default from config, "
                     "127.0.0.1:9464)")
    run.add_argument("--run-dir", type=Path, metavar="DIR",
                     help="run directory (default runs/<run-id>)")
    view = run.add_mutually_exclusive_group()
    view.add_argument("--live", dest="live", action="store_true", default=None,
                      help="draw the live view (default on a terminal)")
    view.add_argument("--no-live", dest="live", action="store_false",
                      help="JSON log lines instead of the live view")

    check = sub.add_parser("check", help="validate a config and print the effective plan")
    check.add_argument("config", type=Path)
    check.add_argument("--duration", type=_duration, metavar="D")
    check.add_argument("--rehearse", type=_duration, metavar="D")

    sim = sub.add_parser("sim", help="serve the embedded vLLM-like simulator")
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=int, default=8000)
    sim.add_argument("--profile", default="edge-4gb")
    sim.add_argument("--model", default="soakd-sim")
    return parser


def _fail(message: str) -> NoReturn:
    print(f"soakd: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def cmd_check(args: argparse.Namespace) -> int:
    from soakd.workload.plan import build_plan, describe_plan

    cfg = load_config(args.config)
    for target in cfg.targets:
        target.api_key()  # a missing key reference is a config error too
    plan = build_plan(cfg, datetime.now(UTC), rehearse_s=args.rehearse,
                      duration_cap_s=args.duration)
    print(f"{args.config}: ok")
    print(describe_plan(plan, cfg))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from soakd.app import RunOptions, Soak
    from soakd.live import errors_table, target_table

    cfg = load_config(args.config)
    for target in cfg.targets:
        target.api_key()
    live = sys.stdout.isatty() if args.live is None else args.live
    opts = RunOptions(run_dir=args.run_dir, duration_s=args.duration, rehearse_s=args.rehearse,
                      metrics_addr=args.metrics_addr, live=live, console_logs=not live)
    soak = Soak(cfg, opts)
    result = asyncio.run(soak.run())
    # off a terminal (CI logs, files) rich would squeeze the table into 80 columns
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160)
    state = "completed" if result.completed else "stopped early"
    console.print(f"soakd run {result.run_id} {state} after {result.elapsed_s:.1f} s; "
                  f"results in {result.run_dir}")
    console.print(target_table(result.summary, "whole run"))
    errors = errors_table(result.summary)
    if errors is not None:
        console.print(errors)
    if result.cancelled:
        console.print(f"{result.cancelled} request(s) were still running at the drain "
                      "deadline and were cut (counted as 'cancelled')")
    return 0


def cmd_sim(args: argparse.Namespace) -> int:
    from soakd.logs import setup_logging
    from soakd.sim.profiles import PROFILES
    from soakd.sim.server import run_sim

    if args.profile not in PROFILES:
        _fail(f"--profile: unknown profile {args.profile!r} (known: {', '.join(PROFILES)})")
    setup_logging()
    try:
        asyncio.run(run_sim(args.host, args.port, args.profile, args.model))
    except KeyboardInterrupt:
        pass
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    commands = {"run": cmd_run, "check": cmd_check, "sim": cmd_sim}
    try:
        return commands[args.command](args)
    except ConfigError as exc:
        _fail(str(exc))
    except OSError as exc:
        if exc.errno is not None and exc.strerror:
            _fail(f"{exc.strerror}: {getattr(exc, 'filename', None) or exc}")
        raise


if __name__ == "__main__":
    sys.exit(main())
