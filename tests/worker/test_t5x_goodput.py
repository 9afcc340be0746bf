"""T5X's goodput events (:class:`tpuft.worker.loop.framework.Timeline`), in process: what tpuft's hooks into
T5X's loop report (a batch's wait, a save complete, an evaluation over, the start-up's restore) becomes the
run's events, and the breakdown attributes them. T5X itself lives in its own venv: tests/e2e/test_t5x_rigs.py
asserts the events a real T5X run records through the hooks."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tpuft.run import goodput
from tpuft.worker import events
from tpuft.worker.loop.framework import Timeline as T5xTimeline

INITIAL = 1000
"""T5X's steps are absolute: the run fine-tunes a checkpoint at step 1000 for 20 steps."""


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("TPUFT_ATTEMPT", "2")
    events.open_for(tmp_path, 0, chief=True)

    def read() -> list[dict[str, Any]]:
        events.close()
        return [json.loads(line) for line in events.events_file(tmp_path, 0, 2).read_text().splitlines()]

    yield read
    events.close()


def test_each_window_takes_the_waits_of_its_own_steps_only() -> None:
    timeline = T5xTimeline(INITIAL, INITIAL + 20)
    for step in range(
        INITIAL, INITIAL + 12
    ):  # T5X took the next window's first batches before the scalars came
        timeline.batch_taken(step, 0.5 if step < INITIAL + 10 else 3.0)
    assert timeline.waited_before(INITIAL + 10) == pytest.approx(5.0)
    assert timeline.waited_before(INITIAL + 10) == 0.0  # taken: counted in one window
    assert timeline.waited_before(INITIAL + 20) == pytest.approx(6.0)


def test_saves_evaluations_and_a_resumed_restore_are_timed_events(recorded: Any) -> None:
    timeline = T5xTimeline(INITIAL, INITIAL + 20)
    # a fresh run: the initial checkpoint's load is start-up, not a restore
    timeline.restored(time.time() - 1.0)
    timeline.resumed_at = 10
    timeline.restored(time.time() - 2.0)
    timeline.restored(time.time())  # once only
    timeline.trained_to = INITIAL + 10
    timeline.saved(INITIAL + 10, time.time() - 1.5, None)
    timeline.evaluated(time.time() - 3.0)
    with timeline.asking():
        timeline.saved(INITIAL + 15, time.time() - 0.5, None)
    # an early stop's last
    timeline.saved(INITIAL + 17, time.time() - 0.5, "no improvement for 2 evaluations")
    timeline.saved(INITIAL + 20, time.time() - 0.5, None)
    got = recorded()
    assert [(e["kind"], e["step"], e.get("reason")) for e in got] == [
        ("checkpoint_restore", 10, None),
        ("checkpoint_save", 10, "periodic"),
        ("eval", 10, None),
        ("checkpoint_save", 15, "request"),
        ("checkpoint_save", 17, "final"),
        ("checkpoint_save", 20, "final"),
    ]
    seconds = [e["s"] for e in got]
    assert seconds[:3] == [
        pytest.approx(2.0, abs=0.3),
        pytest.approx(1.5, abs=0.3),
        pytest.approx(3.0, abs=0.3),
    ]
    assert all(e["attempt"] == 2 for e in got)


def test_the_breakdown_takes_t5x_s_data_waits_and_saves_apart_from_steps(recorded: Any) -> None:
    timeline = T5xTimeline(INITIAL, INITIAL + 20)
    begin = time.time() - 20.0
    for step in range(INITIAL, INITIAL + 20):
        timeline.batch_taken(step, 0.25)
    for first in (0, 10):  # two 10 s windows, as RunLoop records them with the waits the run hands it
        wait = timeline.waited_before(INITIAL + first + 10)
        events.record("steps", begin + first, 10.0, from_step=first, to_step=first + 10, data_wait_s=wait)
    timeline.saved(INITIAL + 20, time.time() - 1.0, None)  # a 1 s save, the second window's last second
    result = goodput.breakdown_of(recorded(), {"status": "finished", "ended": begin + 20.0}, now=begin + 20.0)
    assert result.badput["data_wait"] == pytest.approx(5.0 * 19 / 20, abs=0.2)  # 2.5 s per window, pro rata
    assert result.badput["checkpoint_save"] == pytest.approx(1.0, abs=0.2)
    assert result.good_s + sum(result.badput.values()) == pytest.approx(result.wall_s)
