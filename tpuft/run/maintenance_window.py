"""A maintenance window as every side of tpuft reads it: the TPU API's ``upcomingMaintenance`` (camelCase),
the metadata server's ``instance/upcoming-maintenance`` (snake_case), the one line a provider puts in a
cluster's details (``maintenance: SCHEDULED PENDING 2026-11-26T16:30:00Z .. 2026-11-26T17:30:00Z``), and the
reason of the checkpoint asked before it. One module so that the provider that writes the line, the watcher
that reads it back and the supervisors that ask for the same window's checkpoint agree on its spelling (a
foundation: stdlib only).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

LEAD_SECONDS = float(os.environ.get("TPUFT_MAINTENANCE_LEAD_SECONDS", "900"))
"""A window is acted on (checkpoint, stop) once it starts within this long: scheduled maintenance is announced
days ahead, and a run is not stopped days early."""

NOTICE_RELPATH = ".tpuft/upcoming-maintenance.json"
"""Under a local worker's home: the local pod's stand-in for the metadata key (its JSON), which ``tpuft drill
maintenance`` writes and the worker's supervisor and the local provider read."""

_KEYS = {
    "kind": ("type",),
    "status": ("maintenanceStatus", "maintenance_status"),
    "start": ("windowStartTime", "window_start_time"),
    "end": ("windowEndTime", "window_end_time"),
}
_LINE = re.compile(r"^(?P<kind>\S+) (?P<status>\S+) (?P<start>\S+) \.\. (?P<end>\S+)$")
_REASON = re.compile(r"^maintenance window at (?P<start>\S+) until (?P<end>\S+)")


def _unix(text: str | None) -> float | None:
    try:
        return (
            datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text and text != "?" else None
        )
    except ValueError:
        return None


def rfc3339(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Window:
    kind: str
    status: str
    start: float | None
    end: float | None

    @classmethod
    def of(cls, announced: dict[str, Any]) -> Window:
        """From the API's or the metadata server's JSON."""
        found = {
            name: next((str(announced[k]) for k in keys if announced.get(k)), "")
            for name, keys in _KEYS.items()
        }
        return cls(
            found["kind"] or "MAINTENANCE",
            found["status"] or "PENDING",
            _unix(found["start"]),
            _unix(found["end"]),
        )

    @classmethod
    def parse(cls, line: str) -> Window | None:
        """The details line back (None for anything else, e.g. ``unknown (...)``)."""
        match = _LINE.match(line.strip())
        if match is None:
            return None
        return cls(match["kind"], match["status"], _unix(match["start"]), _unix(match["end"]))

    def describe(self) -> str:
        start = rfc3339(self.start) if self.start is not None else "?"
        end = rfc3339(self.end) if self.end is not None else "?"
        return f"{self.kind} {self.status} {start} .. {end}"

    def reason(self) -> str:
        """The checkpoint request's reason: the same text from every host and the watcher, so one ask per
        window."""
        start = rfc3339(self.start) if self.start is not None else "?"
        end = rfc3339(self.end) if self.end is not None else "?"
        return f"maintenance window at {start} until {end}"

    def due(self, now: float) -> bool:
        """Pending, not over, and starting within :data:`LEAD_SECONDS` (a window without a start is taken as
        due)."""
        return (
            self.status != "ONGOING"
            and (self.end is None or self.end > now)
            and (self.start is None or self.start - now <= LEAD_SECONDS)
        )


def window_of_reason(reason: str) -> Window | None:
    """The window a stop's cause names (``maintenance window at X until Y``), or None for any other cause."""
    match = _REASON.match(reason or "")
    if match is None:
        return None
    return Window("MAINTENANCE", "PENDING", _unix(match["start"]), _unix(match["end"]))


def notice_details(homes: dict[int, Path | None]) -> dict[str, str]:
    """``maintenance worker I`` for each local worker whose home holds a notice (the local provider's
    details)."""
    found = {}
    for worker, home in homes.items():
        path = home / NOTICE_RELPATH if home is not None else None
        if path is None or not path.is_file():
            continue
        try:
            announced = json.loads(path.read_text())
        except (OSError, ValueError):
            found[f"maintenance worker {worker}"] = f"unknown (unreadable {path})"
            continue
        if isinstance(announced, dict):
            found[f"maintenance worker {worker}"] = Window.of(announced).describe()
    return found
