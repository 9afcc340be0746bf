"""The shared run skeleton (``tpuft.worker.loop``) with plain Python hooks, no backend venv: the cadence of
rows, evaluations and checkpoints, the progress line, keep-best and early stopping, resume, the test
evaluation (once per run), the final export and heartbeat."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tpuft.backends.base import RunLayout
from tpuft.run import rundir
from tpuft.worker import loop as loop_mod
from tpuft.worker.context import WorkerContext
from tpuft.worker.loop import RunLoop, progress_line, steps_to_keep

LAYOUT = RunLayout(manifest="manifest.json")


def recipe(
    *,
    steps: int = 10,
    log_every: int = 4,
    eval_every: int | None = 5,
    checkpoint_every: int | None = 3,
    keep_checkpoints: int = 10,
    keep_best: bool = False,
    patience: int | None = None,
    min_delta: float = 0.0,
    export: bool = True,
) -> Any:
    stopping = SimpleNamespace(patience=patience, min_delta=min_delta) if patience is not None else None
    return SimpleNamespace(
        name="fake",
        model=SimpleNamespace(tokenizer="t5-small"),
        train=SimpleNamespace(
            steps=steps,
            log_every=log_every,
            batch_size=8,
            checkpoint_every=checkpoint_every,
            keep_checkpoints=keep_checkpoints,
            keep_best=keep_best,
            early_stopping=stopping,
        ),
        eval=SimpleNamespace(every=eval_every, metric=None),
        export=SimpleNamespace(hf=export),
        data=SimpleNamespace(test="test.jsonl"),
    )


class Hooks:
    """A trainer of plain numbers: the loss of step k is 1/(k+1); ``scores`` gives each evaluation's exact
    match."""

    def __init__(self, loop: RunLoop, scores: dict[int, float] | None = None, warm_up: int = 1) -> None:
        self.loop, self.scores, self.warm_up = loop, scores or {}, warm_up
        self.calls: list[tuple[str, Any]] = []
        self.window: list[float] = []

    def start(self, step: int) -> int:
        self.calls.append(("start", step))
        return self.warm_up

    def train_step(self, step: int) -> None:
        self.calls.append(("step", step))
        self.window.append(1.0 / (step + 1))

    def progress(self) -> tuple[float, float, float]:
        loss = sum(self.window) / len(self.window)
        tokens = 100.0 * len(self.window)
        self.window = []
        return loss, 1e-3, tokens

    def evaluate(self) -> dict[str, Any]:
        self.calls.append(("evaluate", self.loop.step))
        return {
            "eval_loss": 0.5,
            "eval_token_accuracy": 0.75,
            "eval_exact_match": self.scores.get(self.loop.step, 0.25),
            "eval_examples": 16,
        }

    def save(self, step: int) -> Path | None:
        self.calls.append(("save", step))

        def write(folder: Path) -> None:
            folder.mkdir(parents=True)
            (folder / "weights.txt").write_text(f"weights at {step}\n")

        return self.loop.save_checkpoint(
            step, write, backend="plain", replicas=1, state={"data_position": step}
        )

    def digest(self) -> str:
        return "d1gest"

    def export(self, checkpoint: Path) -> None:
        self.calls.append(("export", checkpoint.name))

    def test(self, checkpoint: Path | None) -> dict[str, Any]:
        self.calls.append(("test", None if checkpoint is None else checkpoint.name))
        return {"examples": 4, "exact_match": 0.75, "bleu": 50.0, "rouge_l": 60.0}

    def named(self, kind: str) -> list[Any]:
        return [value for name, value in self.calls if name == kind]


def context(run_dir: Path, worker: int = 0) -> WorkerContext:
    return WorkerContext(
        run_id=run_dir.name,
        run_dir=run_dir,
        worker_id=worker,
        num_workers=1,
        coordinator="",
        run_url=str(run_dir),
    )


def start(run_dir: Path, cfg: Any, *, chief: bool = True, worker: int = 0) -> RunLoop:
    loop = RunLoop(context(run_dir, worker), cfg, LAYOUT, chief=chief)
    loop.find_checkpoint()
    loop.beat(loop.start_step, phase="starting")
    loop.load_checkpoint()
    loop.has_eval = True
    return loop


def rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / rundir.METRICS).read_text().splitlines()]


def heartbeat(run_dir: Path, worker: int = 0) -> dict[str, Any]:
    return json.loads(rundir.heartbeat_path(run_dir, worker).read_text())


def kept(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / LAYOUT.checkpoints).iterdir())


def test_the_progress_line_is_the_same_for_every_backend() -> None:
    assert (
        progress_line(7, 100, 1.23456, 0.001, 12.345, 678.9)
        == "step 7/100 loss 1.2346 lr 1.00e-03 12.3 ex/s 679 tok/s"
    )


def test_rows_evaluations_and_checkpoints_come_at_their_cadence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TPUFT_RESUME", raising=False)
    run_dir = tmp_path / "run"
    loop = start(run_dir, recipe())
    hooks = Hooks(loop)
    loop_mod.run(loop, hooks)
    assert hooks.named("step") == list(range(10))
    # eval.every, and the final one (never eval.every at the last step)
    assert hooks.named("evaluate") == [
        5,
        10,
    ]
    # checkpoint_every below the last step, then the final checkpoint
    assert hooks.named("save") == [
        3,
        6,
        9,
        10,
    ]
    assert hooks.named("export") == ["step_00000010"]
    logged = rows(run_dir)
    train_rows = [r for r in logged if "loss" in r]
    assert [r["step"] for r in train_rows] == [4, 8, 10]  # log_every, and the last step
    assert list(train_rows[0])[:7] == [
        "step",
        "time",
        "loss",
        "lr",
        "examples_per_s",
        "tokens_per_s",
        "elapsed_s",
    ]
    assert train_rows[0]["loss"] == round(sum(1 / (k + 1) for k in range(4)) / 4, 6)
    assert "first_step_s" in train_rows[0] and all("first_step_s" not in r for r in train_rows[1:])
    eval_rows = [r for r in logged if "eval_loss" in r]
    assert [r["step"] for r in eval_rows] == [5, 10] and all("eval_seconds" in r for r in eval_rows)
    out = capsys.readouterr().out
    assert "[tpuft] training for 10 steps" in out
    assert re.search(r"\[tpuft\] step 4/10 loss 0\.5208 lr 1\.00e-03 [\d.]+ ex/s \d+ tok/s", out)
    assert "[tpuft] eval @ 5: loss 0.5000 token acc 0.7500 exact match 0.2500 (16 examples)" in out
    assert kept(run_dir) == ["step_00000003", "step_00000006", "step_00000009", "step_00000010"]
    state = json.loads((run_dir / "checkpoints" / "step_00000006" / "trainer_state.json").read_text())
    assert state["step"] == 6 and state["backend"] == "plain" and state["data_position"] == 6
    assert {"best", "bad_evals", "stopped_early", "elapsed_s", "replicas"} <= set(state)
    beat = heartbeat(run_dir)
    assert beat["status"] == "finished" and beat["step"] == 10 and beat["params_sha256"] == "d1gest"
    assert (
        beat["eval_exact_match"] == 0.25
        and beat["loss"] == train_rows[-1]["loss"]
        and "stopped_early" not in beat
    )


def test_keep_best_early_stopping_and_the_export_of_the_best(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first evaluation is the best; two without an improvement stop training there, without a final eval;
    the best checkpoint stays besides the last one and is the one exported."""
    monkeypatch.delenv("TPUFT_RESUME", raising=False)
    run_dir = tmp_path / "run"
    cfg = recipe(
        steps=100,
        log_every=2,
        eval_every=2,
        checkpoint_every=None,
        keep_checkpoints=1,
        keep_best=True,
        patience=2,
    )
    loop = start(run_dir, cfg)
    hooks = Hooks(loop, scores={2: 0.5, 4: 0.4, 6: 0.45})
    loop_mod.run(loop, hooks)
    assert loop.step == 6 and hooks.named("evaluate") == [2, 4, 6]
    assert hooks.named("save") == [2, 6]  # the best when it came, the final one
    assert loop.stopped_early is not None and "early stopping at step 6" in loop.stopped_early
    assert kept(run_dir) == ["step_00000002", "step_00000006"]
    assert hooks.named("export") == ["step_00000002"]
    out = capsys.readouterr().out
    assert "exporting the best checkpoint: step 2 (eval_exact_match 0.5000)" in out
    assert f"[tpuft] {loop.stopped_early}" in out
    state = json.loads((run_dir / "checkpoints" / "step_00000006" / "trainer_state.json").read_text())
    assert state["best"]["step"] == 2 and state["stopped_early"] == loop.stopped_early
    beat = heartbeat(run_dir)
    assert beat["stopped_early"] == loop.stopped_early and beat["eval_exact_match"] == 0.45


def test_a_resumed_run_starts_at_its_checkpoint_and_forgets_later_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TPUFT_RESUME", raising=False)
    run_dir = tmp_path / "run"
    cfg = recipe(steps=10, log_every=1, eval_every=None, checkpoint_every=4)
    first = start(run_dir, cfg)
    hooks = Hooks(first)
    loop_mod.train(first, hooks)  # killed before the end: checkpoints at 4 and 8, rows up to 10
    assert [r["step"] for r in rows(run_dir)] == list(range(1, 11))
    capsys.readouterr()
    monkeypatch.setenv("TPUFT_RESUME", "1")
    again = start(run_dir, cfg)
    assert again.start_step == 8 and again.trainer_state["data_position"] == 8
    assert [r["step"] for r in rows(run_dir)] == list(range(1, 9))
    resumed = Hooks(again, warm_up=1)
    loop_mod.run(again, resumed)
    assert resumed.named("start") == [8] and resumed.named("step") == [8, 9]
    assert [r["step"] for r in rows(run_dir) if "loss" in r] == list(range(1, 11))
    out = capsys.readouterr().out
    assert "resuming from checkpoint step_00000008 (step 8 of 10)" in out and "training steps 9 to 10" in out
    assert kept(run_dir) == ["step_00000004", "step_00000008", "step_00000010"]


def test_a_run_resumed_after_an_early_stop_trains_no_more(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TPUFT_RESUME", raising=False)
    run_dir = tmp_path / "run"
    cfg = recipe(steps=100, log_every=2, eval_every=2, checkpoint_every=None, patience=1, min_delta=0.5)
    loop_mod.run(first := start(run_dir, cfg), Hooks(first))
    assert first.step == 4
    monkeypatch.setenv("TPUFT_RESUME", "1")
    again = start(run_dir, cfg)
    hooks = Hooks(again)
    loop_mod.run(again, hooks)
    assert (
        hooks.named("step") == []
        and hooks.named("evaluate") == []
        and again.stopped_early == first.stopped_early
    )
    assert f"resumed after {first.stopped_early}" in capsys.readouterr().out


def test_the_heartbeat_says_starting_until_the_step_is_warm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TPUFT_RESUME", raising=False)
    run_dir = tmp_path / "run"
    loop = start(run_dir, recipe(steps=3, eval_every=None, checkpoint_every=None))
    phases: list[tuple[int, str]] = []
    beat = loop.beat

    def recording(step: int, status: str = "running", phase: str = "step", **extra: Any) -> None:
        phases.append((step, phase))
        beat(step, status, phase, **extra)

    loop.beat = recording  # type: ignore[method-assign]
    loop_mod.train(loop, Hooks(loop, warm_up=2))
    assert phases == [(1, "starting"), (2, "step"), (3, "step")]


def test_a_process_that_is_not_the_chief_writes_no_rows_nor_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TPUFT_RESUME", raising=False)
    run_dir = tmp_path / "run"
    loop = start(run_dir, recipe(steps=6), chief=False, worker=1)
    hooks = Hooks(loop)
    loop_mod.run(loop, hooks)
    assert hooks.named("save") == [3, 6] and hooks.named("export") == [] and hooks.named("evaluate") == [5, 6]
    assert not (run_dir / rundir.METRICS).exists() and not (run_dir / LAYOUT.checkpoints).exists()
    assert capsys.readouterr().out == ""
    assert heartbeat(run_dir, 1)["status"] == "finished"


def test_pruning_keeps_the_last_ones_and_the_best() -> None:
    assert steps_to_keep([2, 4, 6, 8], 2, None) == {6, 8}
    assert steps_to_keep([2, 4, 6, 8], 1, 2) == {2, 8}
    assert steps_to_keep([], 3, None) == set()


def test_the_test_runs_once_before_the_final_save_on_the_best_checkpoint_and_never_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """keep_best and an early stop at step 6 (the best: step 2): the test decodes step 2's checkpoint, before
    the final checkpoint, which records it; a run resumed from that checkpoint does not test again, and still
    ends with the scores in its heartbeat and one test row in metrics.jsonl."""
    monkeypatch.delenv("TPUFT_RESUME", raising=False)
    run_dir = tmp_path / "run"
    cfg = recipe(
        steps=100,
        log_every=2,
        eval_every=2,
        checkpoint_every=None,
        keep_checkpoints=1,
        keep_best=True,
        patience=2,
    )
    loop = start(run_dir, cfg)
    loop.has_test = True
    hooks = Hooks(loop, scores={2: 0.5, 4: 0.4, 6: 0.45})
    loop_mod.run(loop, hooks)
    assert hooks.named("test") == ["step_00000002"]
    assert hooks.calls.index(("test", "step_00000002")) < hooks.calls.index(("save", 6))
    expected = {
        "test_examples": 4,
        "test_exact_match": 0.75,
        "test_bleu": 50.0,
        "test_rouge_l": 60.0,
        "test_checkpoint_step": 2,
    }
    (row,) = [r for r in rows(run_dir) if "test_exact_match" in r]
    assert row["step"] == 6 and expected.items() <= row.items() and "test_seconds" in row
    assert rundir.read_metrics(run_dir).test_row == row
    state = json.loads((run_dir / "checkpoints" / "step_00000006" / "trainer_state.json").read_text())
    assert expected.items() <= state["test"].items()
    assert expected.items() <= heartbeat(run_dir).items()
    out = capsys.readouterr().out
    assert "[tpuft] testing the best checkpoint, step 2 on test.jsonl" in out
    assert (
        "[tpuft] test (checkpoint step 2): exact match 0.7500 bleu 50.0000 rouge l 60.0000 (4 examples)"
        in out
    )

    monkeypatch.setenv("TPUFT_RESUME", "1")
    again = start(run_dir, cfg)
    again.has_test = True
    resumed = Hooks(again)
    loop_mod.run(again, resumed)
    assert resumed.named("test") == [] and again.test_result == state["test"]
    assert [r for r in rows(run_dir) if "test_exact_match" in r] == [row]
    assert expected.items() <= heartbeat(run_dir).items()


def test_a_test_after_the_last_step_was_saved_is_noted_in_that_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A framework that saves the last step before the loop's end (the events, not the driver): the final save
    finds the step saved and writes the test into its trainer_state.json, the manifest anew (still complete).
    Without keep_best the test takes the weights in memory."""
    monkeypatch.delenv("TPUFT_RESUME", raising=False)
    run_dir = tmp_path / "run"
    loop = start(run_dir, recipe(steps=3, eval_every=None, checkpoint_every=None))
    loop.has_test = True
    hooks = Hooks(loop)
    loop_mod.train(loop, hooks)
    folder = hooks.save(3)
    assert folder is not None and "test" not in json.loads((folder / "trainer_state.json").read_text())
    assert loop.test_due() and loop.test_checkpoint() == (3, None)
    loop_mod.run_test(loop, hooks.test)
    assert not loop.test_due() and hooks.named("test") == [None]
    assert hooks.save(3) == folder
    state = json.loads((folder / "trainer_state.json").read_text())
    assert state["test"]["test_exact_match"] == 0.75 and state["test"]["test_checkpoint_step"] == 3
    assert LAYOUT.is_complete(folder)
