"""CLI: parse, call, print. ``soakd run | check | capacity | report | export | sim | gateway``.
Exit 2 on bad input, one line each."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from soakd import __version__
from soakd.config import ConfigError, load_config, load_decisions, parse_duration
from soakd.journal import JournalError
from soakd.net import parse_host_port

EXIT_USAGE = 2
EXIT_NO_SUCCESS = 3
"""``soakd run``: a target was sent requests and answered none of them successfully."""


def _duration(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be above zero, got {text!r}")
    return seconds


def _addr(text: str) -> str:
    try:
        parse_host_port(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="soakd", description="Multi-day soak tests for LLM inference servers."
    )
    parser.add_argument("--version", action="version", version=f"soakd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a soak test from a config file")
    run.add_argument("config", type=Path)
    run.add_argument(
        "--duration",
        type=_duration,
        metavar="D",
        help="cap the run (e.g. 10m, 72h); the plan is cut there",
    )
    run.add_argument(
        "--rehearse",
        type=_duration,
        metavar="D",
        help="compress the whole plan into D (e.g. 5m) to try a config",
    )
    run.add_argument(
        "--metrics-addr",
        type=_addr,
        metavar="HOST:PORT",
        help="where /metrics and /status listen (default from config, 127.0.0.1:9464)",
    )
    run.add_argument(
        "--run-dir",
        type=Path,
        metavar="DIR",
        help="run directory (default runs/<run-id>); one holding an unfinished run resumes it",
    )
    run.add_argument(
        "--force",
        action="store_true",
        help="resume even though the config differs from the run's (recorded)",
    )
    run.add_argument(
        "--no-preflight",
        dest="preflight",
        action="store_false",
        help="do not ask each target once before the run (one that comes up later: the "
        "run pauses it until it answers)",
    )
    view = run.add_mutually_exclusive_group()
    view.add_argument(
        "--live",
        dest="live",
        action="store_true",
        default=None,
        help="draw the live view (default on a terminal)",
    )
    view.add_argument(
        "--no-live",
        dest="live",
        action="store_false",
        help="JSON log lines instead of the live view",
    )

    check = sub.add_parser("check", help="validate configs and print the effective plan")
    check.add_argument(
        "config",
        type=Path,
        nargs="+",
        metavar="CONFIG",
        help="one or more config files; every problem of each is listed",
    )
    check.add_argument("--duration", type=_duration, metavar="D")
    check.add_argument("--rehearse", type=_duration, metavar="D")
    check.add_argument(
        "--probe",
        action="store_true",
        help="ask each target once, as `run` does first: its models list and one "
        "request of one token (not for simulators soakd starts)",
    )

    report = sub.add_parser("report", help="the side-by-side report of a run, from its journal")
    report.add_argument("run_dir", type=Path, metavar="DIR")
    report.add_argument(
        "more",
        type=Path,
        nargs="*",
        metavar="DIR",
        help="with --fleet: more run directories (or a quoted glob, 'runs/*/soak-1')",
    )
    report.add_argument(
        "--fleet",
        action="store_true",
        help="one report of several boxes' runs of the same plan, side by side, the worst "
        "box first (--check: exit 1 when any box fails)",
    )
    report.add_argument(
        "--format",
        choices=("md", "html", "json", "text"),
        default=None,
        help="md (default), html, json or text",
    )
    report.add_argument(
        "-o", "--output", type=Path, metavar="FILE", help="write to FILE (default: standard output)"
    )
    report.add_argument(
        "--energy-price",
        type=float,
        metavar="PER_KWH",
        help="electricity price per kWh (default: report.energy_price_per_kwh)",
    )
    report.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="judge by this file's slo, compare, report and targets[].slo/cost sections "
        "(targets matched by name) instead of the run's own; just those sections, or a "
        "whole config",
    )
    report.add_argument(
        "--slowest",
        type=int,
        default=10,
        metavar="N",
        help="list the N slowest requests of each target and phase, with "
        "their trace ids (default: 10; 0: none)",
    )
    report.add_argument(
        "--salvage",
        action="store_true",
        help="a damaged journal: report what is readable (a copy beside it), saying what "
        "was lost in the report's first lines",
    )
    report.add_argument(
        "--check",
        action="store_true",
        help="gate on the verdict: exit 1 when a target fails its SLO or the "
        "candidate regresses, 0 when all pass (docs/slo.md)",
    )

    export = sub.add_parser("export", help="per-request rows of a run as CSV or JSON lines")
    export.add_argument("run_dir", type=Path, metavar="DIR")
    export.add_argument("--format", choices=("csv", "jsonl"), default="csv")
    export.add_argument(
        "-o", "--output", type=Path, metavar="FILE", help="write to FILE (default: standard output)"
    )
    export.add_argument(
        "--itl",
        action="store_true",
        help="add each row's inter-token gaps (microseconds): itl_us in arrival order "
        "(journal.itl: exact), itl_sorted_us as sorted 2%% bucket middles (compact, the "
        "default: the order is not stored)",
    )
    export.add_argument(
        "--salvage",
        action="store_true",
        help="a damaged journal: export the rows that are readable (what was lost: on stderr)",
    )

    cap = sub.add_parser(
        "capacity", help="find each target's knee: the highest load at which its SLO holds"
    )
    cap.add_argument("config", type=Path)
    cap.add_argument(
        "--by",
        choices=("rate", "concurrency"),
        help="sweep open-loop rate or closed-loop concurrency (default: capacity.by, else "
        "the first phase's load mode)",
    )
    cap.add_argument(
        "--max-time",
        type=_duration,
        metavar="D",
        help="the whole sweep's bound (default capacity.max_time, 10m)",
    )
    cap.add_argument("--out", type=Path, metavar="FILE", help="also write the result's JSON here")
    cap.add_argument(
        "--run-dir", type=Path, metavar="DIR", help="default runs/<name>-capacity-<time>"
    )
    cap.add_argument("--metrics-addr", type=_addr, metavar="HOST:PORT")
    cap.add_argument(
        "--check", action="store_true", help="exit 1 when a knee is below its capacity.floor"
    )

    sim = sub.add_parser("sim", help="serve the embedded vLLM-like simulator")
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=int, default=8000)
    sim.add_argument("--profile", default="edge-4gb")
    sim.add_argument("--model", default="soakd-sim")

    gw = sub.add_parser("gateway", help="serve the guard gateway in front of a model server")
    gw.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="gateway config (docs/gateway.md); without it, the defaults",
    )
    gw.add_argument("--upstream", metavar="URL", help="the model server (overrides the config)")
    gw.add_argument(
        "--listen",
        type=_addr,
        metavar="HOST:PORT",
        help="where to listen (default from config, 127.0.0.1:8080)",
    )
    return parser


def _fail(message: str) -> NoReturn:
    print(f"soakd: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def cmd_check(args: argparse.Namespace) -> int:
    """Check each file; every problem of every file is listed (exit 2 if any)."""
    from soakd.cli_check import check_configs

    return EXIT_USAGE if check_configs(args) else 0


def cmd_run(args: argparse.Namespace) -> int:
    from soakd import runtime

    runtime.prepare_process()  # before any thread allocates
    from rich.console import Console

    from soakd.report import Report, build_report, final_verdict, terminal_summary
    from soakd.report.failing import never_answered
    from soakd.run.app import RunOptions, Soak, StartError, StoppedBeforeStart
    from soakd.run.live import errors_table, target_table
    from soakd.run.startcheck import check_start

    cfg = load_config(args.config)
    capacity = None
    if cfg.shares or cfg.sweeps:  # shares of the knee resolved, sweep phases hooked
        from soakd.capacity.shares import for_run

        capacity = for_run(cfg, args.metrics_addr)
        cfg = capacity.cfg
    longest = check_start(cfg)  # before the run dir is touched (`soakd check` says the same)
    live = sys.stdout.isatty() if args.live is None else args.live
    opts = RunOptions(
        run_dir=args.run_dir,
        duration_s=args.duration,
        rehearse_s=args.rehearse,
        metrics_addr=args.metrics_addr,
        live=live,
        console_logs=not live,
        force=args.force,
        preflight=args.preflight,
        on_sweep=capacity.on_sweep if capacity else None,
        longest=longest,
    )
    soak = Soak(cfg, opts)
    if capacity is not None:
        capacity.keep(soak.run_dir)  # the knees the shares resolved against, for the report
    loss = soak.resume.loss if soak.resume is not None else None
    if loss is not None:  # said before the live view hides the log; journaled too
        _warn(f"{loss.describe()}; the run goes on from where it had got to")
    runtime.favour_the_loop()
    try:
        result = asyncio.run(soak.run())
    except StartError as exc:  # a simulator or gateway soakd starts did not come up
        _fail(str(exc))
    except StoppedBeforeStart:
        print("soakd: stopped before the run began: nothing was recorded", file=sys.stderr)
        return 0
    # off a terminal (CI logs, files) rich would squeeze the table into 80 columns
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160)
    state = "completed" if result.completed else "stopped early"
    resumed = f" (session {result.session}, resumed)" if result.session > 1 else ""
    console.print(
        f"soakd run {result.run_id} {state} after {result.elapsed_s:.1f} s{resumed}; "
        f"results in {result.run_dir}"
    )
    if result.journal_unwritten:  # the disk never came back, even for the reserve
        console.print(
            f"WARNING: the journal could not write its final state: {result.journal_unwritten:,}"
            " record(s) are in no file; this session measured "
            + ", ".join(f"{t} {row['requests']:,}" for t, row in result.summary.items())
            + " request(s); the figures below are what the journal holds",
            style="bold red",
        )
    rep: Report | None = None
    try:  # the report's summary: the whole run, every session, from the journal
        rep = build_report(result.run_dir, slowest_n=0)
        for part in terminal_summary(rep):
            console.print(part)
        dead = never_answered(rep.overall)  # over the whole run
    except Exception as exc:  # the run's own numbers are still worth printing
        console.print(f"(no report from the journal: {type(exc).__name__}: {exc})")
        console.print(target_table(result.summary, "this session"))
        errors = errors_table(result.summary)
        if errors is not None:
            console.print(errors)
        dead = never_answered(result.summary)
    console.print(f"report: soakd report {result.run_dir} --format html -o report.html")
    if result.cancelled:
        console.print(
            f"{result.cancelled} request(s) were still running at the drain "
            "deadline and were cut (counted as 'cancelled': not judged)"
        )
    if rep is not None:  # last: what stays on screen once the live view is gone
        console.print(final_verdict(rep))
    expected = {t.name for t in cfg.targets if t.expect_failure}
    failed = {t: kinds for t, kinds in dead.items() if t not in expected}
    for t, kinds in failed.items():
        print(
            f"soakd: targets[{t}] never answered a request successfully ({kinds}); "
            "targets[].expect_failure: true if that is the point",
            file=sys.stderr,
        )
    return EXIT_NO_SUCCESS if failed else 0


EXIT_FAILED = 1


def _judge_by(args: argparse.Namespace) -> dict[str, object] | None:
    """``report --config``: the sections that decide (a whole config is fine too)."""
    if args.config is None:
        return None
    return load_decisions(args.config).model_dump(mode="json")


def _run_dirs(paths: Sequence[Path]) -> list[Path]:
    """The run directories named, a glob expanded (quoted, or from a shell that left it
    unmatched), each once, in the order given."""
    import glob

    out: list[Path] = []
    for path in paths:
        if path.exists() or not glob.has_magic(str(path)):
            found = [path]
        else:
            found = [Path(p) for p in sorted(glob.glob(str(path))) if Path(p).is_dir()]
            if not found:
                _fail(f"{path}: no run directory matches")
        out += [p for p in found if p.resolve() not in {q.resolve() for q in out}]
    return out


def cmd_report_fleet(args: argparse.Namespace) -> int:
    """``soakd report DIR DIR... --fleet``: the boxes side by side (soakd/report/fleet.py)."""
    from soakd.report.fleet import (
        FLEET_RENDERERS,
        PlanMismatch,
        build_fleet,
        fleet_check_lines,
        fleet_terminal,
    )

    if not args.fleet:
        _fail(
            "report: several run directories: add --fleet for one report of several boxes' "
            "runs of the same plan"
        )
    dirs = _run_dirs([args.run_dir, *args.more])
    if len(dirs) < 2:
        _fail("report --fleet: give two or more run directories (or a glob matching them)")
    try:
        fr = build_fleet(dirs, energy_price_per_kwh=args.energy_price, judge_by=_judge_by(args))
    except PlanMismatch as exc:
        _fail(str(exc))
    fmt = args.format or "md"
    show = not args.check or args.format is not None or args.output is not None
    if show and fmt == "text":
        from rich.console import Console

        console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160)
        for part in fleet_terminal(fr):
            console.print(part)
    elif show:
        text = FLEET_RENDERERS[fmt](fr)
        if args.output is None:
            sys.stdout.write(text)
        else:
            tmp = args.output.with_name(args.output.name + ".tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(args.output)
            print(f"{args.output}: {fmt} fleet report of {len(dirs)} runs", file=sys.stderr)
    if not args.check:
        return 0
    verdict = "\n".join(fleet_check_lines(fr))
    print(verdict, file=sys.stdout if not show or args.output is not None else sys.stderr)
    if fr.passed is None:
        _fail("report --fleet: nothing to check: no run's config has an slo or compare block")
    return 0 if fr.passed else EXIT_FAILED


def cmd_report(args: argparse.Namespace) -> int:
    from soakd.report import build_report, check_lines, terminal_summary, write_built

    if args.fleet or args.more:
        return cmd_report_fleet(args)
    judge_by = _judge_by(args)
    rep = build_report(
        args.run_dir,
        energy_price_per_kwh=args.energy_price,
        judge_by=judge_by,
        slowest_n=args.slowest,
        salvage=args.salvage,
    )
    fmt = args.format or "md"
    if fmt != "text":  # (the text form opens with them itself)
        for warning in rep.warnings:  # the file may not be read soon: said here too
            _warn(warning)
    # --check alone prints the verdict; with --format or -o the report goes there too
    show = not args.check or args.format is not None or args.output is not None
    if show and fmt == "text":
        from rich.console import Console

        console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160)
        for part in terminal_summary(rep):
            console.print(part)
    elif show:
        text = write_built(rep, fmt, args.output)
        if args.output is None:
            sys.stdout.write(text)
        else:
            print(f"{args.output}: {fmt} report of {args.run_dir}", file=sys.stderr)
    if not args.check:
        return 0
    verdict = "\n".join(check_lines(rep))
    print(verdict, file=sys.stdout if not show or args.output is not None else sys.stderr)
    if rep.passed is None:
        _fail(
            f"{args.run_dir}: nothing to check: the run's config has no slo or compare "
            "block, or none of its criteria could be measured"
        )
    return 0 if rep.passed else EXIT_FAILED


def _warn(text: str) -> None:
    print(f"soakd: warning: {text}", file=sys.stderr)


def _note(text: str) -> None:
    print(f"soakd: note: {text}", file=sys.stderr)


def cmd_export(args: argparse.Namespace) -> int:
    from soakd.report.export import export

    how = {"itl": args.itl, "salvage": args.salvage, "warn": _warn, "note": _note}
    if args.output is None:
        try:
            export(args.run_dir, args.format, sys.stdout, **how)
            sys.stdout.flush()
        except BrokenPipeError:  # `soakd export DIR | head`: the reader had enough
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    tmp = args.output.with_name(args.output.name + ".tmp")
    try:
        with tmp.open("w", encoding="utf-8", newline="") as out:
            n = export(args.run_dir, args.format, out, **how)
    except BaseException:
        tmp.unlink(missing_ok=True)  # no half-written file left behind
        raise
    tmp.replace(args.output)
    print(f"{args.output}: {n} request rows", file=sys.stderr)
    return 0


def cmd_capacity(args: argparse.Namespace) -> int:
    from soakd.capacity.command import run_capacity
    from soakd.run.session import StartError

    try:
        return run_capacity(args)
    except StartError as exc:  # a simulator or gateway soakd starts did not come up
        _fail(str(exc))


def cmd_sim(args: argparse.Namespace) -> int:
    from soakd.logs import setup_logging
    from soakd.profiles import PROFILES
    from soakd.sim.server import run_sim

    if args.profile not in PROFILES:
        _fail(f"--profile: unknown profile {args.profile!r} (known: {', '.join(PROFILES)})")
    setup_logging()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_sim(args.host, args.port, args.profile, args.model))
    return 0


def cmd_gateway(args: argparse.Namespace) -> int:
    import contextlib
    import os

    from soakd.config import gateway_config_from_dict, load_gateway_config
    from soakd.gateway import run_gateway
    from soakd.logs import setup_logging

    if args.config is None and args.upstream is None:
        _fail("gateway: give --config FILE or --upstream URL")
    overrides = {k: v for k, v in (("upstream", args.upstream), ("listen", args.listen)) if v}
    if args.config is not None:
        cfg = load_gateway_config(args.config)
        if overrides:
            cfg = gateway_config_from_dict(cfg.model_dump(mode="json") | overrides)
    else:
        cfg = gateway_config_from_dict(dict(overrides), os.environ)
    token = None
    if cfg.admin_token_env:
        token = os.environ.get(cfg.admin_token_env) or None
        if token is None:
            _fail(f"admin_token_env: environment variable {cfg.admin_token_env} is not set")
    setup_logging(cfg.logging.level, cfg.logging.format)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_gateway(cfg, admin_token=token))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    commands = {
        "run": cmd_run,
        "check": cmd_check,
        "capacity": cmd_capacity,
        "report": cmd_report,
        "export": cmd_export,
        "sim": cmd_sim,
        "gateway": cmd_gateway,
    }
    try:
        code = commands[args.command](args)
        sys.stdout.flush()  # here, where a closed pipe is still ours to handle
    except (ConfigError, JournalError) as exc:
        _fail(str(exc))
    except sqlite3.DatabaseError as exc:  # damage the integrity check did not see
        where = getattr(args, "run_dir", None)
        _fail(
            f"{where or 'the journal'}: unreadable ({exc}); "
            f"`soakd report {where or 'DIR'} --salvage` reads what is readable"
        )
    except BrokenPipeError:  # `soakd check ... | head`: the reader had enough, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        if exc.errno is not None and exc.strerror:
            where = getattr(exc, "filename", None)
            _fail(f"{where}: {exc.strerror}" if where else exc.strerror)
        raise
    return code


if __name__ == "__main__":
    sys.exit(main())
