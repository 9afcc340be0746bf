"""What ``tpuft gc`` reports, whichever API made the capacity (:mod:`tpuft.ops.gc` for the Cloud TPU API,
:mod:`tpuft.ops.gc_compute` for Compute Engine): the leak record, how tpuft's own resources are told from
the project's others, and the ages they are reported with."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

CREATED_BY = ("created-by", "tpuft")
"""The label every node tpuft creates carries (``TpuNodes.node_spec``)."""


@dataclass
class Leak:
    """One resource to remove: what it is, where, why, what it costs at list price, and (after --yes) the
    outcome."""

    kind: str
    """``node`` or ``queued resource``."""
    name: str
    zone: str
    state: str
    reason: str
    accelerator: str
    pricing: str
    price_per_hour: float | None
    """The whole resource's list price per hour (every slice's chips) for its pricing; an estimate."""
    age_s: float | None
    """Seconds since the API's createTime, or for an idle node since it was last used."""
    age_of: str
    """What ``age_s`` measures: ``created`` or ``idle``."""
    nodes: list[str] = field(default_factory=list)
    deleted: bool = False
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "zone": self.zone,
            "state": self.state,
            "reason": self.reason,
            "accelerator": self.accelerator,
            "pricing": self.pricing,
            "price_per_hour": self.price_per_hour,
            "age_s": None if self.age_s is None else round(self.age_s, 1),
            "age_of": self.age_of,
            "nodes": self.nodes,
            "deleted": self.deleted,
            "error": self.error or None,
        }


def ours(labels: dict[str, str]) -> bool:
    return labels.get(CREATED_BY[0]) == CREATED_BY[1]


def unix(stamp: Any) -> float | None:
    """The API's createTime (a datetime from the client, or RFC 3339 text) as unix seconds; None when
    unset."""
    if stamp is None or stamp == "":
        return None
    if isinstance(stamp, datetime):
        return stamp.timestamp() if stamp.year > 1970 else None
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def age(stamp: Any, now: float) -> float | None:
    created = unix(stamp)
    return None if created is None else max(0.0, now - created)


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"
