"""What a run has cost so far: its attempts' chip-hours times the catalogue's list price, as the capacity was
created.

Why computed and never stored: the cost of a running attempt grows with the clock, and a price correction in
the catalogue should change every reader's figure at once. run.json carries what the computation needs and
cannot be guessed later: ``chips`` (every slice's) and ``pricing`` (``on-demand``, ``spot`` or ``reserved``,
from the cluster file when the run was launched), with each attempt's ``started`` and ``ended``. A run.json
from before those fields is priced from its accelerator and slices, on demand, and the note says it assumed
so.

What is counted: the attempts' wall time, the time the trainers ran. The node's time around them (creation,
setup, the wait before a recovery, a node left idle after the run) is billed too but is not the run's: ``tpuft
gc`` finds the idle and leaked capacity. Every figure is an estimate (list prices of one region; discounts and
taxes not known), and says so. The same arithmetic serves ``train.max_cost`` in the chief's supervisor
(:func:`run_cost` with the clock).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tpuft.core.accelerators import lookup
from tpuft.core.errors import UsageError

PRICINGS = ("on-demand", "spot", "reserved")
ESTIMATE_NOTE = "estimate: chip-hours of the attempts x the list price (us-central, no discounts)"


def pricing_of(
    spot: bool = False, preemptible: bool = False, reserved: bool = False, reservation: str | None = None
) -> str:
    """How the capacity is billed, from the cluster file's ``gcp`` keys: legacy preemptible is priced as
    spot."""
    if spot or preemptible:
        return "spot"
    if reserved or reservation:
        return "reserved"
    return "on-demand"


def chips_of(accelerator: str, slices: int = 1) -> int | None:
    """Every slice's chips together; None for an accelerator the catalogue does not know."""
    try:
        return lookup(accelerator).chips * max(1, int(slices))
    except (UsageError, ValueError, TypeError):
        return None


def price_per_chip_hour(accelerator: str, pricing: str) -> float | None:
    """The catalogue's USD per chip-hour for ``pricing``; None where unknown (an unknown type or tier)."""
    try:
        return lookup(accelerator).generation.price(pricing)
    except (UsageError, ValueError, TypeError):
        return None


@dataclass(frozen=True)
class AttemptCost:
    attempt: int
    chips: int
    hours: float
    chip_hours: float
    price_per_chip_hour: float | None
    usd: float | None
    """None where the price is unknown (the chip-hours still are)."""
    pricing: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "chips": self.chips,
            "hours": round(self.hours, 6),
            "chip_hours": round(self.chip_hours, 6),
            "price_per_chip_hour": self.price_per_chip_hour,
            "usd": None if self.usd is None else round(self.usd, 4),
            "pricing": self.pricing,
        }


@dataclass(frozen=True)
class RunCost:
    per_attempt: list[dict[str, Any]]
    """:meth:`AttemptCost.as_dict` of each attempt, in order."""
    total_usd: float | None
    """None when no attempt's price is known."""
    chip_hours: float
    note: str
    billed: bool = True
    """False on the local pod: the figures say what the same hours would cost on its accelerator."""
    attempts: list[AttemptCost] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "per_attempt": self.per_attempt,
            "chip_hours": round(self.chip_hours, 6),
            "total_usd": None if self.total_usd is None else round(self.total_usd, 4),
            "note": self.note,
            "billed": self.billed,
        }

    def label(self) -> str:
        """One short figure for a table cell: ``$12.34 (est.)``, or the chip-hours where no price is known."""
        if self.total_usd is None:
            return f"{self.chip_hours:.2f} chip-h"
        return f"${self.total_usd:,.2f} (est.{'' if self.billed else ', not billed'})"


def run_cost(info: dict[str, Any], now: float | None = None) -> RunCost:
    """The cost so far of the run that run.json ``info`` describes: an attempt without ``ended`` counts until
    ``now`` while the run is running, else until the run's ``ended`` (or ``now`` when run.json has none)."""
    now = time.time() if now is None else now
    accelerator = str(info.get("accelerator") or "")
    assumed = "pricing" not in info
    default_pricing = str(info.get("pricing") or "on-demand")
    default_chips = info.get("chips") or chips_of(accelerator, info.get("slices") or 1) or 0
    attempts = list(info.get("attempts") or [])
    if not attempts and info.get("started") is not None:
        attempts = [
            {
                "attempt": info.get("attempt", 1),
                "started": info["started"],
                **({"ended": info["ended"]} if "ended" in info else {}),
            }
        ]
    costs = []
    for index, entry in enumerate(attempts):
        started = _number(entry.get("started"))
        if started is None:
            continue
        end = _number(entry.get("ended"))
        if end is None:
            last = index == len(attempts) - 1
            end = now if (last and info.get("status") == "running") else (_number(info.get("ended")) or now)
        pricing = str(entry.get("pricing") or default_pricing)
        chips = int(entry.get("chips") or default_chips)
        hours = max(0.0, end - started) / 3600.0
        price = price_per_chip_hour(accelerator, pricing)
        chip_hours = chips * hours
        costs.append(
            AttemptCost(
                int(entry.get("attempt") or index + 1),
                chips,
                hours,
                chip_hours,
                price,
                None if price is None else chip_hours * price,
                pricing,
            )
        )
    known = [c.usd for c in costs if c.usd is not None]
    billed = info.get("provider") != "local"
    note = ESTIMATE_NOTE
    if assumed:
        note += "; priced on demand (run.json predates its pricing)"
    if not billed:
        note += (
            "; local pod: nothing is billed, this is what the same hours would cost on "
            f"{accelerator or 'its accelerator'}"
        )
    if costs and len(known) < len(costs):
        note += f"; no list price known for {accelerator} {default_pricing}"
    return RunCost(
        per_attempt=[c.as_dict() for c in costs],
        total_usd=sum(known) if known else None,
        chip_hours=sum(c.chip_hours for c in costs),
        note=note,
        billed=billed,
        attempts=costs,
    )


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def launch_fields(accelerator: str, gcp: Any, slices: int) -> dict[str, Any]:
    """run.json's ``pricing`` and ``chips`` at launch, from the cluster file (``gcp``: its ``GcpConfig``)."""
    pricing = pricing_of(gcp.spot, gcp.preemptible, gcp.reserved, gcp.reservation)
    return {"pricing": pricing, "chips": chips_of(accelerator, slices)}


def check_budget(
    run_id: str, info: dict[str, Any], max_cost: float | None, now: float | None = None
) -> dict[str, Any]:
    """run.json ``info`` for a resume, with ``max_cost`` (a new ``train.max_cost``) when given; refused when
    the run has spent its limit already, which would stop it again at its first step."""
    if max_cost is not None:
        if not max_cost > 0:
            raise UsageError(f"--max-cost {max_cost}: must be more than 0 (USD)")
        info = {**info, "max_cost": max_cost}
    limit = info.get("max_cost")
    spent = run_cost(info, now).total_usd if limit else None
    if limit and spent is not None and spent >= float(limit):
        raise UsageError(
            f"run {run_id} has cost ${spent:,.2f} so far ({ESTIMATE_NOTE}): its train.max_cost "
            f"${float(limit):,.2f} is spent",
            hint=f"raise it: tpuft resume {run_id} --max-cost USD",
        )
    return info
