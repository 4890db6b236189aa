"""Report room, the head: what was tested, read from what the journal stored of the run.

The journal keeps the run's redacted config and resolved plan (``meta``), each session's
host (its ``run_started``/``run_resumed`` event) and the request rows; from them the top of
every report says which targets (model, endpoint, api, stream), which plan (phases, load
shapes, durations; a rehearsal stamped as one), which sizes (planned and served), which
soakd, where and when. ``header_lines`` and ``tested_tables`` are the one place that
writes it: the Markdown, HTML and terminal renderers all call them, and the JSON report
carries ``Report.tested`` as it is.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from soakd.config import format_duration
from soakd.config.redact import scrub_url
from soakd.journal.reader import StoredSession
from soakd.journal.records import Logged, RunResumed, RunStarted
from soakd.journal.stored import StoredLoad, StoredPlan, StoredPrompts, StoredRun, StoredTarget
from soakd.model import NS_PER_S
from soakd.report.model import PhaseTested, Report, TargetTested, Tested
from soakd.report.output_tokens import asked, asked_words
from soakd.report.table import Table, cells, fmt_duration
from soakd.shapes import shape_of
from soakd.workload.prompts import describe_lengths

Served = Mapping[str, tuple[float | None, float | None]]
"""target -> (mean prompt tokens, mean output tokens) of its successful requests."""

_SERVED_SQL = """
SELECT target, AVG(prompt_tokens), AVG(output_tokens) FROM requests
WHERE error IS NULL GROUP BY target
"""


def served_tokens(conn: sqlite3.Connection) -> dict[str, tuple[float | None, float | None]]:
    """Per target, the mean prompt tokens (as the server's usage counted them; requests
    without usage left out) and output tokens of its successful requests: one grouped
    query over the request rows (retention may have deleted old ones)."""
    return {t: (p, o) for t, p, o in conn.execute(_SERVED_SQL)}


def _iso(wall: float | None) -> str:
    if wall is None:
        return "-"
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _prompt_plan(prompts: StoredPrompts) -> str:
    """The workload's prompt lengths, as configured (``workload.prompts``)."""
    if prompts.source != "synthetic":
        name = str(prompts.file or "?").rsplit("/", 1)[-1]
        return f"{prompts.source} {name} (its own lengths)"
    shown = describe_lengths(prompts.input_tokens)
    p = prompts.prefix
    if p is not None and p.share > 0:
        shown += f", {p.share:.0%} with one of {p.count} shared prefixes of {p.tokens}"
    return shown


def _endpoint(t: StoredTarget) -> str:
    if t.simulator:
        return f"simulator {t.simulator}"
    url = scrub_url(t.base_url)  # stored redacted already: twice is safe
    if t.deployment:
        url += f" (deployment {t.deployment})"
    return url


def _shape(load: StoredLoad) -> str:
    return shape_of(**load.model_dump(exclude_unset=True)).describe()  # as stored


def _phases(plan: StoredPlan) -> list[PhaseTested]:
    """The plan's phases, a looped plan's repeats of one phase folded into one row."""
    out: dict[str, PhaseTested] = {}
    for p in plan.phases:
        start, end = p.start_ns / NS_PER_S, p.end_ns / NS_PER_S
        seen = out.get(p.name)
        if seen is not None:
            seen.times += 1
            continue
        loads = {t: _shape(load) for t, load in p.loads.items()}
        out[p.name] = PhaseTested(p.name, start, end - start, (end - start) / plan.scale, 1, loads)
    return list(out.values())


def what_was_tested(
    stored: StoredRun,
    sessions: Sequence[StoredSession],
    events: Sequence[Logged],
    served: Served,
    answers: str | None = None,
) -> Tested:
    """From what the journal stored of the run (config, plan, flags), its sessions and
    events; ``answers``: the answers' planned lengths, described (None: none planned)."""
    config, plan, workload = stored.config, stored.plan, stored.config.workload
    hosts = [
        e.host for row in events if isinstance(e := row.event, RunStarted | RunResumed) and e.host
    ]
    prompts = (
        "conversations: the turns so far"  # each turn's context: every earlier turn, answered
        if workload.conversations is not None
        else _prompt_plan(workload.prompts)
    )
    targets = []
    for t in config.targets:
        mean_in, mean_out = served.get(t.name, (None, None))
        targets.append(
            TargetTested(
                name=t.name,
                model=t.deployment or t.model,
                endpoint=_endpoint(t),
                api=f"{t.kind} {t.api}",
                stream=t.stream,
                gateway=t.guarded,
                prompt_tokens_planned=prompts,
                max_tokens=workload.max_tokens,
                prompt_tokens_served=mean_in,
                output_tokens_served=mean_out,
                output_tokens_planned=(
                    None
                    if answers is None
                    else f"{answers} ({asked_words(asked(config, t.name), short=True)})"
                ),
            )
        )
    return Tested(
        run_name=config.run.name,
        node=config.run.node,
        site=config.run.site,
        hosts=list(dict.fromkeys(hosts)),
        started=_iso(stored.created_wall),
        ended=_iso(max((s.wall for s in sessions), default=None)),
        rehearsal=stored.options.rehearse_s is not None or plan.scale != 1.0,
        scale=plan.scale,
        configured_plan_s=plan.end_s / plan.scale,
        duration_cap_s=stored.options.duration_s,
        prompts=workload.prompts.source,
        temperature=workload.temperature,
        targets=targets,
        phases=_phases(plan),
    )


# --- rendering: every format calls these -------------------------------------------------------


def rehearsal_line(t: Tested) -> str:
    return (
        f"REHEARSAL: the {format_duration(t.configured_plan_s)} plan compressed into "
        f"{fmt_duration(t.configured_plan_s * t.scale)} (1 s stands for "
        f"{format_duration(1 / t.scale)}; loads at their configured rates): a try of the "
        "config, not a soak. No cost per month and no leak slope are projected from it."
    )


def header_lines(rep: Report) -> list[str]:
    """The run in a few lines: id, state, time, soakd, where; a rehearsal stamped first."""
    t = rep.tested
    state = "completed" if rep.completed else "not completed (stopped or still running)"
    lines = [rehearsal_line(t)] if t is not None and t.rehearsal else []
    when = f"from {t.started} to {t.ended}" if t is not None else f"created {rep.created}"
    lines.append(f"run {rep.run_id}, {state}, {when}")
    lines.append(
        f"active {fmt_duration(rep.active_s)} of a {fmt_duration(rep.plan_s)} plan in "
        f"{rep.sessions} session(s); downtime {fmt_duration(rep.downtime_s)}"
    )
    where = f"soakd {', '.join(rep.versions)}"
    if t is not None:
        where += f" on {', '.join(t.hosts) or 'an unrecorded host'} (node {t.node or '-'}"
        where += f", site {t.site or '-'})"
    lines.append(where)
    return lines


def _tokens(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def target_lines(rep: Report) -> list[str]:
    """The targets as lines, for a terminal too narrow for the table: each wraps whole."""
    t = rep.tested
    if t is None:
        return []
    return [
        f"{x.name}: {x.model} at {x.endpoint}{' via soakd gateway' if x.gateway else ''} "
        f"({x.api}, {'streamed' if x.stream else 'not streamed'}); prompt tokens "
        f"{x.prompt_tokens_planned}, served {_tokens(x.prompt_tokens_served)}; output "
        f"tokens {_output_plan(x, 'max ')}, served {_tokens(x.output_tokens_served)}"
        for x in t.targets
    ]


def _output_plan(x: TargetTested, cap: str = "") -> str:
    """The answers' planned lengths and how they were asked, else max_tokens, the cap."""
    if x.output_tokens_planned is not None:
        return f"planned {x.output_tokens_planned}"
    return f"{cap}{x.max_tokens:,}"


def tested_tables(rep: Report) -> list[Table]:
    """The targets as they were called, and the plan as it ran."""
    return [table for table in (targets_table(rep), plan_table(rep)) if table is not None]


def targets_table(rep: Report) -> Table | None:
    t = rep.tested
    if t is None:
        return None
    header = [
        "target",
        "model",
        "endpoint",
        "api",
        "stream",
        "prompt tokens: planned / served",
        "output tokens: max / served",
    ]
    targets = Table("What was tested", header, numeric=[False] * len(header))
    for x in t.targets:
        endpoint = x.endpoint + (" via soakd gateway" if x.gateway else "")
        targets.rows.append(
            cells(
                [
                    x.name,
                    x.model,
                    endpoint,
                    x.api,
                    "yes" if x.stream else "no",
                    f"{x.prompt_tokens_planned} / {_tokens(x.prompt_tokens_served)}",
                    f"{_output_plan(x)} / {_tokens(x.output_tokens_served)}",
                ]
            )
        )
    return targets


def plan_table(rep: Report) -> Table | None:
    """The plan's phases, their durations (configured, and as run in a rehearsal) and the
    load shape of each target."""
    t = rep.tested
    if t is None:
        return None
    names = [x.name for x in t.targets]
    rehearsed = ["configured", "as run"] if t.rehearsal else ["duration"]
    title = f"The plan ({format_duration(t.configured_plan_s)}"
    title += ", rehearsed)" if t.rehearsal else ")"
    if t.duration_cap_s is not None:
        title += f", cut at --duration {format_duration(t.duration_cap_s)}"
    plan = Table(
        title,
        ["phase", "start", *rehearsed, *names],
        numeric=[False, True, *(True for _ in rehearsed), *(False for _ in names)],
    )
    for p in t.phases:
        times = f" x{p.times}" if p.times > 1 else ""
        span = [format_duration(p.configured_s) + times]
        if t.rehearsal:
            span.append(fmt_duration(p.duration_s) + times)
        plan.rows.append(
            cells(
                [
                    p.name,
                    format_duration(p.start_s / t.scale),
                    *span,
                    *(p.loads.get(n, "idle") for n in names),
                ]
            )
        )
    return plan
