"""The run's parts, assembled before it runs: each stage a frozen value, nothing Optional.

``Setup``: what a run is before anything opens (the plan, the resume state, the
registry and the in-memory readers), made at once from the config. ``Servers``: the child
servers soakd starts and the preflight's answers. ``Parts``: the journal and everything
that sends or reads outcomes, with the runner last. ``soakd/run/app.py`` runs them.

Each builder registers what it opened on the caller's exit stack (or list of closes) as it
goes, so a start that fails half-way closes what it had opened, and what the builder
returns is whole: no placeholder is swapped later, no part is None.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import structlog

from soakd.checks.identity import Identities, Seen
from soakd.checks.mix import Checks, Judged
from soakd.checks.verdict import PASS, RESULTS
from soakd.config import Config, ConfigError, Slo, TargetConfig
from soakd.gateway.fronts import Fronts
from soakd.journal import (
    JOURNAL_FILE,
    Journal,
    ResumeState,
    RunInfo,
    config_doc,
    open_journal,
    plan_doc,
    read_resume_state,
    records,
    rollup_window_ns,
)
from soakd.journal.messages import Restored
from soakd.journal.metrics import JournalMetrics
from soakd.journal.stored import StoredOptions
from soakd.measure.goodput import GoodputWindow
from soakd.measure.notes import Notes
from soakd.metrics.checks import CheckMetrics
from soakd.metrics.run import GuardMetrics, Metrics, ProbeMetrics, RunSeries
from soakd.model import Phase, Plan, SpendCap
from soakd.probes import Probes, make_probes
from soakd.probes.gateways import GatewayExport, export_gateways
from soakd.run.rundir import new_run_id
from soakd.run.session import RunOptions, StartError, _close_all
from soakd.run.stats import RunStats
from soakd.sim.spawn import SimProcess, spawn_sim
from soakd.targets.errors import redact
from soakd.targets.preflight import Preflight, preflight
from soakd.targets.tokenize import open_tokenizer
from soakd.types import Target
from soakd.workers.reuse import NoReuse
from soakd.workers.senders import Senders, WorkerStartError, open_senders, senders_for
from soakd.workload.answers import workload_answers
from soakd.workload.calibration import Calibration, LocalTokenizer, TokenCounter, TokenizeError
from soakd.workload.conversations import make_conversations
from soakd.workload.fits import check_fits, longest_request
from soakd.workload.guard import Guards, TargetGuard
from soakd.workload.ledger import SendLedger
from soakd.workload.plan import build_plan
from soakd.workload.prompts import PromptSource, SyntheticPrompts, make_prompt_source
from soakd.workload.runner import Runner
from soakd.workload.sizing import (
    TOKENIZE_TIMEOUT_S,
    PromptLengths,
    StartMeasure,
    log_start,
    measure_at_start,
    stored,
)

log = structlog.get_logger()

Close = Callable[[], Coroutine[Any, Any, None]]


@dataclass(frozen=True)
class Setup:
    """A run before anything opens: made from the config (and an unfinished journal in
    the run dir, resumed: JournalError when it cannot be)."""

    cfg: Config
    opts: RunOptions
    resume: ResumeState | None  # None: a fresh run
    run_id: str
    run_dir: Path
    plan_start: datetime
    plan_options: dict[str, float | None]  # rehearse_s, duration_s: stored for a resume
    plan: Plan
    config_changes: list[str]  # a resume's differences from the stored config
    metrics: Metrics
    probe_metrics: ProbeMetrics
    guard_metrics: GuardMetrics
    names: list[str]
    stats: RunStats
    goodput: GoodputWindow
    notes: Notes  # usage not taken or off the stream, unreadable Retry-After
    fronts: Fronts  # the gateways soakd starts
    tokenizer: LocalTokenizer | None  # workload.tokenizer, when calibrating
    live_slo: dict[str, dict[str, float]]  # each target's limits, for the live view

    @classmethod
    def open(cls, cfg: Config, opts: RunOptions) -> Setup:
        resume = read_resume_state(opts.run_dir / JOURNAL_FILE) if opts.run_dir else None
        run_id = resume.run_id if resume else new_run_id(cfg.run.name)
        run_dir = opts.run_dir or Path("runs") / run_id
        first = resume.stored.options if resume else StoredOptions()
        # a resume keeps the first session's flags unless given again
        plan_options = {
            "rehearse_s": opts.rehearse_s if opts.rehearse_s is not None else first.rehearse_s,
            "duration_s": opts.duration_s if opts.duration_s is not None else first.duration_s,
        }
        plan_start = resume.plan_start if resume else datetime.now(UTC)
        plan = build_plan(
            cfg,
            plan_start,
            rehearse_s=plan_options["rehearse_s"],
            duration_cap_s=plan_options["duration_s"],
        )
        series = RunSeries(
            run_id,
            cfg.run.node,
            cfg.run.site or "",
            cfg.slo,
            cfg.alert_limits,
            tuple(sorted({p.name for p in plan.phases})),
            tuple(cfg.targets),
            resume.created_wall if resume else time.time(),
        )
        # held: until the journal's totals are in (a resume)
        metrics = Metrics(held=resume is not None, run=series)
        names = [t.name for t in cfg.targets]
        slos: dict[str, Slo] = {name: cfg.slo_for(name) for name in names}
        goodput = GoodputWindow(slos)
        # prompts in the target's tokens (soakd/workload/sizing.py): a bad file fails here
        tok = cfg.workload.tokenizer
        return cls(
            cfg,
            opts,
            resume,
            run_id,
            run_dir,
            plan_start,
            plan_options,
            plan,
            resume.check(cfg, plan, force=opts.force) if resume else [],
            metrics,
            ProbeMetrics(metrics.registry),
            GuardMetrics(metrics.registry),
            names,
            RunStats(names),
            goodput,
            Notes(),
            Fronts(cfg.phases, run_dir),
            LocalTokenizer(tok) if tok and cfg.workload.calibrate == "auto" else None,
            {name: slo.model_dump(exclude_none=True) for name, slo in slos.items()},
        )


@dataclass(frozen=True)
class Servers:
    """The servers the run sends to, started and asked once."""

    clients: tuple[TargetConfig, ...]  # the targets as the clients see them
    urls: dict[str, str]  # each target's server, as the probes watch it (not a gateway)
    preflight: tuple[Preflight, ...]  # empty when not asked


async def start_servers(s: Setup, sims: list[SimProcess]) -> Servers:
    """The simulators and gateways soakd starts, then the preflight of every target's
    server (the simulator's, the one behind a gateway: docs/architecture.md). ``sims``
    gets each simulator as it starts, for the caller to close."""
    servers: list[TargetConfig] = []
    clients: list[TargetConfig] = []
    for tcfg in s.cfg.targets:
        if tcfg.simulator:
            try:
                log_file = s.run_dir / f"sim-{tcfg.name}.log"
                sim = await spawn_sim(tcfg.simulator, tcfg.model, log_file)
            except RuntimeError as exc:
                raise StartError(f"targets[{tcfg.name}].simulator", exc) from None
            sims.append(sim)
            tcfg = tcfg.model_copy(update={"base_url": sim.base_url})
        servers.append(tcfg)  # probes and the preflight ask the server, not a gateway
        if tcfg.gateway is not None:
            try:
                tcfg = await s.fronts.front(tcfg)
            except RuntimeError as exc:
                raise StartError(f"targets[{tcfg.name}].gateway", exc) from None
        clients.append(tcfg)
    asked = await _preflight(s, servers) if s.opts.preflight else ()
    return Servers(tuple(clients), {t.name: t.base_url for t in servers}, asked)


async def _preflight(s: Setup, servers: list[TargetConfig]) -> tuple[Preflight, ...]:
    """Ask each server once; a problem ends the start (ConfigError: one line a target,
    exit 2). Warnings go on: the server's own trouble, a target meant to fail, and on a
    resume one that does not answer yet (a reboot: the run pauses it until it does)."""
    answers = tuple(await preflight(servers, identity=s.cfg.checks is not None))
    problems = []
    for r, tcfg in zip(answers, servers, strict=True):
        if r.ok and not r.warning:
            log.info("preflight_ok", target=r.target, seconds=round(r.seconds, 3))
        elif r.ok or tcfg.expect_failure or (r.unreached and s.resume is not None):
            log.warning("preflight_warning", target=r.target, problem=r.line)
            if not s.opts.console_logs:  # the live view: the log is in soakd.log
                print(f"soakd: warning: {r.line}", file=sys.stderr)
        else:
            problems.append(r.line)
    if problems:
        raise ConfigError.of(problems)
    wl = s.cfg.workload
    longest = s.opts.longest or longest_request(wl, make_prompt_source(wl))
    check_fits(s.cfg, longest, {r.target: r.max_model_len for r in answers})
    return answers


async def start_journal(s: Setup, servers: Servers) -> Journal:
    """Open or continue the run's journal (a resume restores the counters from it), and
    record the preflight's answers."""
    run = RunInfo(
        s.run_id,
        config_doc(s.cfg),
        plan_doc(s.plan),
        s.plan_start,
        s.plan_options,
        rollup_window_ns(s.plan),
    )
    journal = await open_journal(
        s.run_dir,
        run,
        s.cfg.journal,
        metrics=JournalMetrics(s.metrics.registry, s.metrics.continued),
        forward=(s.metrics, s.stats),  # each batch's fold, once committed
        resume=s.resume,
    )
    if s.resume is not None and journal.restored is not None:
        _resumed(s, s.resume, journal, journal.restored)
    for r in servers.preflight:
        journal.event(
            records.Preflight(
                r.target, r.ok, r.line, r.seconds, r.unreached, r.warning, r.models, r.version
            )
        )
    return journal


def _resumed(s: Setup, resume: ResumeState, journal: Journal, restored: Restored) -> None:
    """A resume: the counters continue, and what changed or was lost is said."""
    missing = s.metrics.restore(restored.totals, restored.histograms)
    s.metrics.restore_notes(restored.notes)
    s.notes.restore(restored.notes)
    if s.config_changes:
        journal.event(records.ConfigChanged(tuple(s.config_changes)))
    loss = resume.loss
    if loss is not None:  # said, and kept: the next session's mark will not know
        journal.event(
            records.JournalLoss(loss.rows, loss.requests, loss.offset_ns, loss.held_offset_ns)
        )
        log.error("journal_loss", **asdict(loss), note=loss.describe())
    log.warning(
        "run_resumed",
        session=journal.session,
        plan_offset_s=round(resume.offset_ns / 1e9, 3),
        down_since=datetime.fromtimestamp(resume.last_wall, UTC).isoformat(timespec="seconds"),
        config_changes=s.config_changes or None,
        not_restored=missing or None,
    )


@dataclass(frozen=True)
class Parts:
    """Everything that sends or reads outcomes, whole."""

    journal: Journal
    ledger: SendLedger  # sends not made, by reason
    guards: Guards
    no_reuse: NoReuse  # statuses after which a server closes its connections unannounced
    senders: Senders  # the targets' clients, here or in worker processes
    probes: Probes
    gateways: GatewayExport  # the gateways soakd started, on soakd's own /metrics
    lengths: PromptLengths
    runner: Runner

    @property
    def targets(self) -> dict[str, Target]:
        return self.senders.targets


@dataclass(frozen=True)
class Hooks:
    """What the parts call back into the run with."""

    on_phase: Callable[[Phase | None], None]
    on_no_reuse: Callable[[str, int, bool], None]  # target, status, closes


def start_ledger(s: Setup, journal: Journal) -> SendLedger:
    """The sends not made, continued from the journal on a resume (and their counter)."""
    ledger = SendLedger(
        journal.restored.missed if s.resume and journal.restored else None,
        on_miss=s.metrics.missed,
    )
    for key, n in ledger.counts.items():
        s.metrics.missed(*key, n)  # continue the counter
    return ledger


async def assemble(
    s: Setup,
    servers: Servers,
    journal: Journal,
    ledger: SendLedger,
    hooks: Hooks,
    closes: list[Close],
) -> Parts:
    """Guards, target clients, probes, the prompts, then the runner. ``closes`` gets each
    client as it opens, for the caller to close."""
    guards = Guards(_guard(s, tcfg, journal) for tcfg in servers.clients)
    no_reuse = NoReuse(hooks.on_no_reuse)
    n, why = senders_for(s.cfg.run.workers, s.plan, s.cfg.workload.longest_answer)
    log.info("senders", processes=n, why=why)  # how many send, and why (auto: the plan)
    try:
        senders = await open_senders(
            n,
            list(servers.clients),
            run_id=s.run_id,
            run_dir=s.run_dir,
            registry=s.metrics.registry,
            no_reuse=no_reuse,
            workload=s.cfg.workload,
        )
    except WorkerStartError as exc:
        raise StartError("run.workers", exc) from None
    closes.append(senders.aclose)
    probes = make_probes(s.cfg, s.probe_metrics, servers.urls, journal.sample)
    closes.append(probes.aclose)
    gateways = export_gateways(
        {t: g.url for t, g in s.fronts.gateways.items()},
        s.cfg.probes.scrape_interval,
        s.metrics.registry,
        journal.sample,
    )
    # the next prompt seq per target: the runner counts on in this dict (a resume continues
    # the stored ones), the prompt lengths' check reads it
    # (and the next conversation number, under conversation_key: soakd/workload/talks.py)
    seqs = dict(s.resume.next_seq) if s.resume else {}
    for name in s.names:
        seqs.setdefault(name, 0)
    lengths = await _size_prompts(
        s, journal, servers.urls, partial(_unused_seq, seqs, s.names), senders.calibrate
    )
    if isinstance(lengths.prompts, SyntheticPrompts):  # sized: so is what the senders build
        for cal in lengths.prompts.calibrations:
            senders.calibrate(cal)
    wl = s.cfg.workload
    checks = _checks(s, journal, servers.preflight)
    runner = Runner(
        s.plan,
        senders.targets,
        lengths.prompts,
        # the sinks read each outcome as ``Finished``: no ITL, with workers or without
        [s.goodput, probes.outcome_sink, s.notes, lengths, *([checks] if checks else [])],
        guards=guards,  # each outcome's 429 or spend reaches the gates first
        # then the journal, the one reader of the whole outcome (ITL included): it folds
        # each outcome once and hands the folds on to Metrics and RunStats once
        # committed: Prometheus never counts a request the journal could lose
        # (docs/journal.md)
        journal=journal,
        max_tokens=s.cfg.workload.max_tokens,
        temperature=s.cfg.workload.temperature,
        seed=s.cfg.workload.seed,
        on_phase=hooks.on_phase,
        seqs=seqs,
        gates=senders.gates(guards.by_target),
        ledger=ledger,
        lead_ns=senders.lead_ns,
        on_sink_failure=lambda sink: s.metrics.sink_failures.labels(sink).inc(),
        answers=workload_answers(wl, lengths.prompts),  # planned answer lengths
        # their plan (a ShareGPT file's, from the prompts already read); the senders build text
        conversations=make_conversations(wl, source=lengths.prompts),
        on_failure=wl.conversations.on_failure if wl.conversations else "end",
        on_conversation=s.metrics.conversation,
        checks=checks.spec if checks else None,  # a share of the requests are checks
    )
    journal.attach(runner)
    return Parts(journal, ledger, guards, no_reuse, senders, probes, gateways, lengths, runner)


def _checks(s: Setup, journal: Journal, asked: tuple[Preflight, ...]) -> Checks | None:
    """``checks:`` mixed into the load (docs/checks.md): each verdict journaled, counted and,
    when it is no pass, logged (the first per target, then at each power of two)."""
    cfg = s.cfg.checks
    if cfg is None:
        return None
    metrics = CheckMetrics(s.metrics.registry)
    kinds = [*cfg.kinds, *(["file"] if cfg.file else []), *(["reference"] if cfg.reference else [])]
    metrics.start(s.names, kinds, RESULTS)
    failed: dict[str, int] = {}
    keys = {t.name: key.get_secret_value() for t in s.cfg.targets if (key := t.api_key())}

    def emit(j: Judged) -> None:
        key = keys.get(j.target)
        shown = redact(j.answer, key) if key and j.answer else j.answer  # a server's echo
        journal.event(
            records.CheckJudged(j.target, j.phase, j.seq, j.check, j.result, j.score, shown)
        )
        metrics.judged(j.target, j.check, j.result)
        if j.result != PASS:
            n = failed[j.target] = failed.get(j.target, 0) + 1
            if n & (n - 1) == 0:
                log.warning("check_failed", target=j.target, check=j.check, result=j.result,
                            seq=j.seq, score=j.score, failed=n)  # fmt: skip

    def identified(target: str, now: Seen, before: Seen | None) -> None:
        previous = before or ("", "")
        journal.event(records.Identity(target, *now, *previous))
        metrics.identified(target, *now, changed=before is not None)
        if before is None:
            log.info("target_identity", target=target, model=now[0], fingerprint=now[1])
        else:
            was = {"was_model": before[0], "was_fingerprint": before[1]}
            log.warning(
                "target_identity_changed", target=target, model=now[0], fingerprint=now[1], **was
            )

    identities = Identities(identified)
    for r in asked:  # what each target said it is at start: its preflight's answer
        if r.identity is not None:
            identities.seen(r.target, r.identity)
    return Checks(cfg, emit, identities)


def _unused_seq(seqs: dict[str, int], names: Sequence[str]) -> int:
    """The next prompt seq no target has used."""
    return max((seqs[name] for name in names), default=0)


def _guard(s: Setup, tcfg: TargetConfig, journal: Journal) -> TargetGuard:
    """A target's send guard (docs/gateway.md), exported."""
    if tcfg.api_key_env:
        key_ref = f"api_key_env {tcfg.api_key_env}"
    elif tcfg.api_key_file:
        key_ref = f"api_key_file {tcfg.api_key_file}"
    else:
        key_ref = ""
    spend = tcfg.spend
    limits = {cap: spend.limit(cap) for cap in SpendCap}
    return TargetGuard(
        tcfg.name,
        spend,
        tcfg.rate_limit,
        key_ref=key_ref,
        failing=tcfg.failing,
        gauges=s.guard_metrics.add_target(tcfg.name, limits),
        on_event=journal.event,
    )


async def _size_prompts(
    s: Setup,
    journal: Journal,
    urls: dict[str, str],
    next_seq: Callable[[], int],
    on_corrected: Callable[[Calibration], None],
) -> PromptLengths:
    """The prompts, sized in the reference's tokens: measured now (``urls``: each
    target's server), or as the run measured them before a resume; and the sink that
    checks them against the first answers and tallies planned against served (a
    correction applies from ``next_seq()``, the next seq no target has used)."""
    wl = s.cfg.workload
    # a run an older soakd started (no workload.calibrate stored) goes on as it ran
    first = s.resume.stored.config.workload.calibrate if s.resume else "auto"
    auto = wl.calibrate == "auto" and first == "auto"
    try:
        done = stored(s.resume.calibrations if s.resume else [])
    except ValueError as exc:
        raise StartError("workload.calibrate", exc) from None
    prompts: PromptSource = make_prompt_source(wl, done.calibrations)
    reference = done.reference
    measure: StartMeasure | None = None
    if done.measured:
        log.info(
            "prompt_calibration_reused",
            calibrations=[c.describe() for c in done.calibrations] or None,
        )
    elif auto:
        measure = await _measure_prompts(s, urls, prompts)
        log_start(measure, s.names)
        journal.event(measure.event())
        cal = measure.calibration
        reference = cal.reference if cal is not None and cal.source == "tokenize" else None
    return PromptLengths(
        prompts,
        s.names,
        # a conversation's history is rebuilt every turn: its sizing never changes mid-run
        checks=done.checks_left if auto and wl.conversations is None else 0,
        reference=reference,
        on_calibration=journal.event,
        next_seq=next_seq,
        measured=measure,
        on_corrected=on_corrected,
    )


async def _measure_prompts(s: Setup, urls: dict[str, str], prompts: PromptSource) -> StartMeasure:
    """Ask each target's /tokenize (its server's, not a gateway's) and the local
    tokenizer: sizing.measure_at_start."""
    t0 = time.monotonic()
    servers: dict[str, TokenCounter] = {}
    failed: dict[str, str] = {}
    closes = []
    try:
        for tcfg in s.cfg.targets:
            try:
                server = await open_tokenizer(tcfg, urls[tcfg.name], TOKENIZE_TIMEOUT_S)
            except (TokenizeError, ValueError) as exc:
                failed[tcfg.name] = str(exc)
            else:
                servers[tcfg.name] = server
                closes.append(server.aclose)
        measure = await measure_at_start(prompts, servers, local=s.tokenizer, failed=failed)
        measure.seconds = time.monotonic() - t0  # the clients' set-up included
        return measure
    finally:
        await _close_all("tokenizer", [close() for close in closes])


async def close_clients(closes: list[Close]) -> None:
    """The clients opened so far, together (one that fails is logged)."""
    await _close_all("client", [close() for close in closes])
