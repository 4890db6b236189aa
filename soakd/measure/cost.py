"""Cost: what a target costs over the run, per million output tokens, and per month at the
measured load. Pure: prices come from the config (``targets[].cost``), nothing is fetched.

A target's cost over its active time is the sum of what its config names:

- ``per_hour``: an all-in hourly price (a rented box), x active hours; without it, the
  energy of its GPUs at ``report.energy_price_per_kwh`` (when measured and not shared);
- ``hardware: {price, months}``: a box bought outright, written off evenly over
  ``months`` (a month is 730 h, a year / 12), charged for the active time;
- ``per_mtok: {input, output}``: a cloud's price per million prompt and output tokens.

Per month: that cost's rate over the active time x 730 h, i.e. the bill if the measured
load ran all month. Per million output tokens: cost / output tokens x 1e6.
"""

from __future__ import annotations

from dataclasses import dataclass

from soakd.config import TargetCost

HOUR_S = 3600.0
MONTH_S = 730 * HOUR_S
"""A month: 365 days / 12."""


@dataclass(frozen=True)
class CostLine:
    total: float | None  # over the active time
    per_month: float | None
    per_mtok: float | None  # per million output tokens
    basis: str | None  # what it is made of, for the reader


def cost_line(
    cost: TargetCost,
    active_s: float,
    prompt_tokens: int,
    output_tokens: int,
    energy: tuple[float, str] | None = None,
) -> CostLine:
    """``energy``: (its cost, how it was priced), used when there is no ``per_hour``."""
    total = 0.0
    parts: list[str] = []
    if cost.per_hour is not None:
        total += cost.per_hour * active_s / HOUR_S
        parts.append(f"{cost.per_hour:g}/h")
    elif energy is not None:
        total += energy[0]
        parts.append(energy[1])
    if cost.hardware is not None:
        hw = cost.hardware
        total += hw.price / hw.months / MONTH_S * active_s
        parts.append(f"hardware {hw.price:g} over {hw.months:g} months")
    if cost.per_mtok is not None:
        price = cost.per_mtok
        total += (prompt_tokens * price.input + output_tokens * price.output) / 1e6
        parts.append(f"{price.input:g} in / {price.output:g} out per M tokens")
    if not parts:
        return CostLine(None, None, None, None)
    return CostLine(
        total=total,
        per_month=total / active_s * MONTH_S if active_s > 0 else None,
        per_mtok=total / output_tokens * 1e6 if output_tokens else None,
        basis=" + ".join(parts),
    )


__all__ = ["MONTH_S", "CostLine", "cost_line"]
