"""train.max_cost on worker 0's supervisor (tpuft/worker/supervisor/cost_guard.py), on a fake clock: nothing
asked below the limit, one checkpoint request with stop at the limit (at a step every host can still reach),
an outright stop when no checkpoint follows, and no guard on other workers or without the key."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tpuft.run import rundir
from tpuft.storage import open_storage
from tpuft.worker.supervisor.cost_guard import STOP_GRACE_SECONDS, CostGuard

HOUR = 3600.0
PER_HOUR = 4 * 3.22  # v4-8 on demand: 4 chips


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _storage(tmp_path: Path, **changes: object):  # type: ignore[no-untyped-def]
    storage = open_storage(str(tmp_path / "run"))
    info = {
        "run_id": "r",
        "accelerator": "v4-8",
        "chips": 4,
        "pricing": "on-demand",
        "provider": "gcp",
        "status": "running",
        "workers": 2,
        "attempt": 2,
        "max_cost": PER_HOUR * 1.5,
        "attempts": [{"attempt": 1, "started": -HOUR, "ended": -HOUR / 2}, {"attempt": 2, "started": 0.0}],
        **changes,
    }
    storage.write_text(rundir.RUN_INFO, json.dumps(info))
    return storage


def _requests(storage) -> list[dict]:  # type: ignore[no-untyped-def]
    folder = Path(str(storage.url)) / "attempts" / "2"
    return (
        [json.loads(p.read_text()) for p in sorted(folder.glob("checkpoint-*.json"))]
        if folder.exists()
        else []
    )


def test_the_limit_asks_once_for_a_stopping_checkpoint_then_stops_outright(tmp_path: Path) -> None:
    storage = _storage(tmp_path)
    said: list[str] = []
    guard = CostGuard.start(0, 2, storage, said.append, remote=True, poll_seconds=2.5)
    assert guard is not None and "train.max_cost $19.32" in said[0]
    clock = Clock()
    guard.clock = clock
    clock.now = 0.5 * HOUR  # half an hour before + half an hour now = 1 h of 1.5 h
    assert guard.poll({"step": 100, "time": clock.now}) is None and _requests(storage) == []
    clock.now = HOUR - 10  # 20 steps in 10 s: 2 steps/s
    assert guard.poll({"step": 120, "time": clock.now}) is None and _requests(storage) == []
    clock.now = HOUR  # 1.5 h: the limit
    assert guard.poll({"step": 140, "time": clock.now}) is None
    [request] = _requests(storage)
    assert request["stop"] is True and request["reason"].startswith(
        "train.max_cost reached ($19.32 of $19.32"
    )
    travel = 2.5 + 5.0 + 15.0  # the poll, the relay, a bucket's sync
    assert request["at_step"] == 140 + math.ceil(travel * 2) + 2  # 2 steps/s measured, 2 steps of margin
    assert "asked every trainer for a checkpoint" in said[-1]
    clock.now = HOUR + 60
    assert guard.poll({"step": 150}) is None and len(_requests(storage)) == 1  # asked once
    clock.now = HOUR + STOP_GRACE_SECONDS + 1
    reason = guard.poll({"step": 150})
    assert reason is not None and "no checkpoint within" in reason


def test_no_guard_off_the_chief_or_without_the_key_and_one_host_names_no_step(tmp_path: Path) -> None:
    assert CostGuard.start(1, 2, _storage(tmp_path), print, remote=False, poll_seconds=0.5) is None
    assert (
        CostGuard.start(0, 2, _storage(tmp_path, max_cost=None), print, remote=False, poll_seconds=0.5)
        is None
    )
    storage = _storage(tmp_path, workers=1, max_cost=1.0)
    guard = CostGuard.start(0, 2, storage, print, remote=False, poll_seconds=0.5)
    assert guard is not None
    guard.clock = lambda: HOUR
    guard.poll({"step": 3})
    [request] = _requests(storage)
    assert request["at_step"] is None and request["stop"] is True


@pytest.mark.parametrize("broken", ["", "{not json"])
def test_an_unreadable_run_json_leaves_the_limit_unwatched(tmp_path: Path, broken: str) -> None:
    storage = open_storage(str(tmp_path / "run"))
    storage.write_text(rundir.RUN_INFO, broken)
    assert CostGuard.start(0, 1, storage, print, remote=False, poll_seconds=0.5) is None
