"""``train.max_cost`` on the worker: the chief's supervisor stops the run with a checkpoint when its cost so
far reaches the limit.

Why the supervisor and not the controller: a days-long run is usually left with no terminal attached, and the
limit must hold then too. Worker 0's supervisor reads run.json once (the attempts so far, ``chips``,
``pricing``, ``max_cost``, written at launch or resume) and, at each control poll, prices the run with
:func:`tpuft.run.cost.run_cost` on its own clock: pure arithmetic, no API call. When the limit is reached it
writes a checkpoint request with ``stop`` (the run dir's ``attempts/<n>/checkpoint-<id>.json``, the same file
``tpuft stop --checkpoint`` writes), which every supervisor relays to its trainer: the trainers save at one
step, then stop as ``tpuft stop`` would, and ``tpuft resume`` continues from that checkpoint with no step
lost.

On several hosts every process must save at the same step: the request names ``at_step``, the chief's last
step plus the steps made while the request travels (the supervisors' poll and, on a bucket, its sync), at the
speed this guard measured between its own polls. When the trainers have not stopped :data:`STOP_GRACE_SECONDS`
after the ask (a request refused, a trainer that never reaches a step boundary), the guard stops the run
outright: the limit is a limit, and the last periodic checkpoint is what a resume then starts from.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from tpuft.core.safe_yaml import resolved_section
from tpuft.run import rundir
from tpuft.run.cost import run_cost
from tpuft.storage.sync import SYNC_SECONDS

STOP_GRACE_SECONDS = 900.0
"""From the ask to an outright stop: room for a big checkpoint's save (and a bucket's upload), not for an
hour."""
RELAY_SECONDS = 5.0


class CostGuard:
    """One attempt's watch over ``train.max_cost``, on worker 0's supervisor. ``clock``: for the tests."""

    def __init__(
        self,
        info: dict[str, Any],
        attempt: int,
        storage: Any,
        say: Callable[[str], None],
        *,
        remote: bool,
        poll_seconds: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.info = info
        self.limit = float(info["max_cost"])
        self.attempt = attempt
        self.storage = storage
        self.say = say
        self.remote = remote
        self.poll_seconds = poll_seconds
        self.clock = clock
        self.asked_at: float | None = None
        self.reason = ""
        self._last_beat: tuple[float, int] | None = None
        self._steps_per_s = 0.0

    @classmethod
    def start(
        cls,
        worker: int,
        attempt: int,
        storage: Any,
        say: Callable[[str], None],
        *,
        remote: bool,
        poll_seconds: float,
    ) -> CostGuard | None:
        """The guard of worker 0 when run.json sets ``max_cost``; None elsewhere (and when run.json cannot be
        read: the supervisor says so, and trains on)."""
        if worker != 0:
            return None
        try:
            info = rundir.read_json_text(storage.read_text(rundir.RUN_INFO)) or {}
        except Exception as exc:  # noqa: BLE001 - a bucket hiccup must not stop training; the limit is then unwatched
            say(f"train.max_cost is not watched: cannot read run.json: {exc}")
            return None
        if not info.get("max_cost"):
            return None
        guard = cls(info, attempt, storage, say, remote=remote, poll_seconds=poll_seconds)
        spent = run_cost(info, guard.clock())
        say(f"train.max_cost ${guard.limit:,.2f}: ${spent.total_usd or 0:,.2f} spent so far ({spent.note})")
        return guard

    def poll(self, beat: dict[str, Any]) -> str | None:
        """Price the run now; ask for the stopping checkpoint once the limit is reached. Returns a reason to
        stop the run outright, only when the trainers have not stopped :data:`STOP_GRACE_SECONDS` after the
        ask."""
        now = self.clock()
        self._measure(beat, now)
        if self.asked_at is not None:
            return (
                f"{self.reason}; no checkpoint within {STOP_GRACE_SECONDS:.0f} s of the ask"
                if now - self.asked_at > STOP_GRACE_SECONDS
                else None
            )
        spent = run_cost(self.info, now).total_usd
        if spent is None or spent < self.limit:
            return None
        self.reason = f"train.max_cost reached (${spent:,.2f} of ${self.limit:,.2f}, estimate)"
        request_id = str(int(now * 1000))
        request = {
            "id": request_id,
            "time": now,
            "reason": self.reason,
            "at_step": self._at_step(beat),
            "stop": True,
        }
        try:
            self.storage.write_text(rundir.checkpoint_request(self.attempt, request_id), json.dumps(request))
        except Exception as exc:  # noqa: BLE001 - asked again at the next poll
            self.say(f"cannot write the checkpoint request for train.max_cost: {exc}")
            return None
        self.asked_at = now
        self.say(f"{self.reason}: asked every trainer for a checkpoint, then a stop (request {request_id})")
        return None

    def _measure(self, beat: dict[str, Any], now: float) -> None:
        """Steps per second from two of the chief's heartbeats this guard saw (at their own times)."""
        step = beat.get("step")
        if not isinstance(step, int):
            return
        now = float(beat.get("time") or now)
        if self._last_beat is not None and step > self._last_beat[1] and now > self._last_beat[0]:
            self._steps_per_s = (step - self._last_beat[1]) / (now - self._last_beat[0])
        if self._last_beat is None or step != self._last_beat[1]:
            self._last_beat = (now, step)

    def _at_step(self, beat: dict[str, Any]) -> int | None:
        if int(self.info.get("workers") or 1) <= 1:
            return None  # one process: it serves the request at its next step
        travel = self.poll_seconds + RELAY_SECONDS + (SYNC_SECONDS if self.remote else 0.0)
        try:
            every = int(
                resolved_section(self.storage.read_text(rundir.RECIPE), "train").get("log_every") or 1
            )
        except Exception:  # noqa: BLE001 - unread: every step is a boundary the loops can serve it at
            every = 1
        return rundir.checkpoint_at_step(int(beat.get("step") or 0), self._steps_per_s, travel, every)
