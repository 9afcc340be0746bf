"""``train.time_limit``, in the sequencer alone (:mod:`tpuft.worker.loop.sequencer`), with a trainer of plain
numbers: the run ends at the first ``log_every`` boundary past the budget, saves there, tests and exports,
and finishes; a resume with a new limit goes on from that checkpoint and tests again at its own end. The
three engines hand over to the same code (their real runs: the e2e tests)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.worker.test_loop import Hooks, heartbeat, kept, recipe, rows, start
from tpuft.worker import loop as loop_mod
from tpuft.worker.loop import RunLoop


class Slow(Hooks):
    """Each step takes ``seconds``; ``agree`` records what this host said (one host: its own flag)."""

    def __init__(self, loop: RunLoop, seconds: float) -> None:
        super().__init__(loop)
        self.seconds = seconds
        self.agreed: list[bool] = []

    def train_step(self, step: int) -> None:
        super().train_step(step)
        time.sleep(self.seconds)

    def agree(self, flag: bool) -> bool:
        self.agreed.append(flag)
        return flag


def limited(limit: float | None, **kwargs: Any) -> Any:
    cfg = recipe(**kwargs)
    cfg.train.time_limit = limit
    return cfg


def test_the_time_limit_saves_tests_exports_and_finishes_at_a_log_boundary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TPUFT_RESUME", raising=False)
    run_dir = tmp_path / "run"
    cfg = limited(0.25, steps=40, log_every=4, eval_every=None, checkpoint_every=None)
    loop = start(run_dir, cfg)
    loop.has_test = True
    hooks = Slow(loop, 0.05)
    loop_mod.run(loop, hooks)
    stopped = loop.step
    assert stopped % 4 == 0 and 4 <= stopped < 40, stopped  # a log_every boundary, well before the end
    assert hooks.named("save") == [stopped] and hooks.named("test") == [None]
    assert hooks.named("export") == [f"step_{stopped:08d}"] and not hooks.named("evaluate")
    assert hooks.agreed[-1] and not any(hooks.agreed[:-1])  # asked on each log boundary, once spent
    beat = heartbeat(run_dir)
    assert beat["status"] == "finished" and beat["step"] == stopped and beat["ended"] == "time_limit"
    assert [r["step"] for r in rows(run_dir) if "test_examples" in r] == [stopped]
    out = capsys.readouterr().out
    assert f"train.time_limit reached (0 s) at step {stopped}: saving, testing and exporting now" in out

    # tpuft resume with a new limit (here: none): on from that checkpoint to the end, tested again there
    monkeypatch.setenv("TPUFT_RESUME", "1")
    again = start(run_dir, limited(None, steps=40, log_every=4, eval_every=None, checkpoint_every=None))
    again.has_test = True
    assert again.start_step == stopped and not again.test_result  # the time-limited test does not count
    resumed = Slow(again, 0.0)
    loop_mod.run(again, resumed)
    assert resumed.named("step")[0] == stopped and again.step == 40 and not resumed.agreed
    assert [r["step"] for r in rows(run_dir) if "test_examples" in r] == [stopped, 40]
    assert heartbeat(run_dir)["status"] == "finished" and "ended" not in heartbeat(run_dir)
    assert kept(run_dir)[-1] == "step_00000040"


def test_no_limit_asks_no_agreement_and_a_limit_not_reached_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TPUFT_RESUME", raising=False)
    for limit, asked in ((None, 0), (3600.0, 2)):  # log boundaries 4 and 8 (the last step, 10, is not asked)
        run_dir = tmp_path / f"run-{limit}"
        loop = start(run_dir, limited(limit))
        hooks = Slow(loop, 0.0)
        loop_mod.run(loop, hooks)
        assert loop.step == 10 and loop.ended is None and len(hooks.agreed) == asked
        assert hooks.named("save") == [3, 6, 9, 10] and "ended" not in heartbeat(run_dir)


def test_the_time_limit_is_a_recipe_duration() -> None:
    from tpuft.config.recipe import TrainConfig

    assert TrainConfig(steps=10, time_limit="1h30m").time_limit == 5400.0
    assert TrainConfig(steps=10).time_limit is None
    with pytest.raises(ValueError, match="not a duration"):
        TrainConfig(steps=10, time_limit="soon")
