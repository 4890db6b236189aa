"""``soakd check``: each config file validated as ``soakd run`` reads it, then its effective
plan, prompt sizes, sender processes, SLOs and comparison printed; ``--probe`` also asks
each target what ``run``'s preflight asks. soakd/cli.py parses and calls ``check_configs``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime
from pathlib import Path

from soakd.config import Config, ConfigError, load_config


def check_configs(args: argparse.Namespace) -> int:
    """Check each file of ``args.config``; every problem of every file is printed, one
    line each. Returns how many files failed."""
    failed = 0
    for path in args.config:
        try:
            _check_one(path, args)
        except ConfigError as exc:
            failed += 1
            text = str(exc)
            if len(args.config) > 1 and not text.startswith(str(path)):
                text = f"{path}: {text}"
            print(f"soakd: error: {text}", file=sys.stderr)
    return failed


def _check_one(path: Path, args: argparse.Namespace) -> None:
    from soakd.run.startcheck import check_start
    from soakd.workload.answers import answer_lines
    from soakd.workload.conversations import conversation_lines
    from soakd.workload.plan import build_plan, describe_plan
    from soakd.workload.sizing import plan_lines

    cfg = load_config(path)
    if cfg.shares:  # shares of the knee: resolved from the stored result, or said
        from soakd.capacity.shares import from_result, share_lines

        if cfg.capacity is not None and cfg.capacity.result is not None:
            cfg = from_result(cfg)
        else:
            check_start(cfg)
            print(f"{path}: ok")
            print("\n".join(share_lines(cfg)))
            print("capacity.measure: the knees are measured when soakd run starts (no plan yet)")
            return
    check_start(cfg)  # what `soakd run` reads before it starts: the same lines
    plan = build_plan(
        cfg, datetime.now(UTC), rehearse_s=args.rehearse, duration_cap_s=args.duration
    )
    prompt_lines = asyncio.run(plan_lines(cfg))  # a bad tokenizer file: a ConfigError
    print(f"{path}: ok")
    print(describe_plan(plan, cfg))
    if cfg.shares:
        from soakd.capacity.shares import share_lines

        print("\n".join(share_lines(cfg)))
    print("\n".join(prompt_lines + conversation_lines(cfg.workload) + answer_lines(cfg)))
    from soakd.workers.senders import senders_for

    n, why = senders_for(cfg.run.workers, plan, cfg.workload.longest_answer)
    print(f"senders: {n} worker processes ({why})" if n > 1 else f"senders: this process ({why})")
    if cfg.checks is not None:
        from soakd.checks.mix import describe_checks

        print(describe_checks(cfg.checks))
    if not cfg.slo.empty or any(not t.slo.empty for t in cfg.targets):
        from soakd.measure.verdicts import describe_slo

        for target in cfg.targets:  # the effective SLO: run-wide with the target's overrides
            print(f"slo {target.name}: {describe_slo(cfg.slo_for(target.name))}")
    if cfg.compare is not None:
        c = cfg.compare
        print(f"compare: {c.candidate} against baseline {c.baseline}")
    if args.probe:
        _probe(cfg)


def _probe(cfg: Config) -> None:
    """``check --probe``: the preflight of ``run`` (a gateway's target: the server behind
    it); a problem is a ConfigError (exit 2), a warning is printed."""
    from soakd.logs import setup_logging
    from soakd.targets.preflight import preflight

    setup_logging(console=False)  # the lines below say it all: no client log on the screen
    servers = [t for t in cfg.targets if not t.simulator]
    for t in cfg.targets:
        if t.simulator:
            print(f"targets[{t.name}]: the simulator soakd starts: asked when `run` starts it")
    problems = []
    for r, t in zip(asyncio.run(preflight(servers)), servers, strict=True):
        if r.ok or t.expect_failure:
            print(("warning: " if not r.ok or r.warning else "") + r.line)
        else:
            problems.append(r.line)
    if problems:
        raise ConfigError.of(problems)
