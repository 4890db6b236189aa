"""Report room, prefix cache: the shared prefixes planned beside the server's own hit ratio.

Planned is what the stored config asked for (``workload.prompts.prefix``: a share of the
requests opening with one of K prefixes of L tokens; a Mooncake trace's repeated blocks);
the server's hit ratio is vLLM's ``prefix_cache_hits_total`` over its
``prefix_cache_queries_total`` (prompt tokens), as soakd's probe journaled them, per phase
and over the run. llama.cpp serves no such counter: its rows say so.
"""

from __future__ import annotations

from collections.abc import Sequence

from soakd.journal.stored import StoredWorkload
from soakd.report import names
from soakd.report.model import PrefixCacheRow, Report
from soakd.report.samples import Samples
from soakd.report.table import Table, cells


def planned_prefixes(workload: StoredWorkload) -> str | None:
    """The shared prefixes the workload planned, in words (None: none planned)."""
    prompts = workload.prompts
    p = prompts.prefix
    if p is not None and p.share > 0:
        return f"{p.share:.0%} of requests, {p.count:,} × {p.tokens:,} tokens"
    if prompts.source == "mooncake":
        return "the trace's repeated hash_ids"
    return None


def prefix_rows(
    probe: Samples, workload: StoredWorkload, targets: Sequence[str], phases: Sequence[str]
) -> list[PrefixCacheRow]:
    """A row per target and phase whose server counted its prefix cache, and one per
    target over the run; none when no target's did and none were planned."""
    planned = planned_prefixes(workload)
    rows: list[PrefixCacheRow] = []
    for target in targets:
        match = {"target": target}
        queries = probe.increase(names.SERVER_PREFIX_CACHE_QUERIES, match)
        hits = probe.increase(names.SERVER_PREFIX_CACHE_HITS, match) or {}
        if queries is None:
            if planned is not None:
                rows.append(PrefixCacheRow(target, "run", planned, None, None))
            continue
        for phase in [*phases, "run"]:
            q = sum(queries.values()) if phase == "run" else queries.get(phase, 0.0)
            h = sum(hits.values()) if phase == "run" else hits.get(phase, 0.0)
            if q > 0 or phase == "run":
                rows.append(PrefixCacheRow(target, phase, planned or "none", q, h))
    return rows


def prefix_table(rep: Report) -> Table | None:
    """Prefix cache: planned against the server's hit ratio (None: nothing to say)."""
    if not rep.prefix_cache:
        return None
    table = Table(
        "Prefix cache: planned shared prefixes, the server's hit ratio",
        ["target", "phase", "planned", "prompt tokens looked up", "found", "hit ratio"],
        numeric=[False, False, False, True, True, True],
    )
    for r in rep.prefix_cache:
        if r.queried is None:
            shown = ["-", "-", "not served (no prefix-cache counter: llama.cpp, the simulator)"]
        else:
            ratio = r.hit_ratio
            shown = [
                f"{r.queried:,.0f}",
                f"{r.hits or 0:,.0f}",
                "-" if ratio is None else f"{ratio * 100:.1f} %",
            ]
        table.rows.append(cells([r.target, r.phase, r.planned, *shown]))
    return table
