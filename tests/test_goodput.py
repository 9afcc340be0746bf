"""Goodput (``tpuft.run.goodput``) on synthetic timelines, and the events a tiny in-process RunLoop records
(``tpuft.worker.events``): the causes always sum to the wall time; steps a later attempt redid are lost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.worker.test_loop import Hooks, recipe, start
from tpuft.run import goodput, rundir
from tpuft.storage import open_storage
from tpuft.worker import events
from tpuft.worker import loop as loop_mod

T0 = 1_800_000_000.0


def ev(kind: str, t: float, s: float, attempt: int = 1, **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "t": T0 + t, "s": s, "attempt": attempt, **extra}


def windows(
    attempt: int, begin: float, first_step: int, last_step: int, every: int, seconds: float
) -> list[dict[str, Any]]:
    out, t = [], begin
    for step in range(first_step, last_step, every):
        out.append(ev("steps", t, seconds, attempt, from_step=step, to_step=step + every))
        t += seconds
    return out


def summed(result: goodput.Goodput) -> float:
    return result.good_s + sum(result.badput.values())


def test_an_uninterrupted_run_is_mostly_steps_and_its_causes_sum_to_the_wall_time() -> None:
    timeline = [
        ev("provision", 0, 60),
        ev("setup", 60, 30),
        ev("launch", 90, 5),
        ev("startup", 92, 20, step=0),
    ]
    timeline += windows(1, 112, 0, 100, 10, 10)  # 100 s of steps, up to t=212
    timeline += [
        ev("checkpoint_save", 150, 4, step=40, reason="periodic"),
        ev("eval", 190, 6, step=80),
        ev("checkpoint_save", 212, 3, step=100, reason="final"),
        ev("export", 215, 5),
    ]
    info = {
        "status": "finished",
        "created": T0,
        "attempts": [{"started": T0 + 90, "ended": T0 + 225}],
        "ended": T0 + 225,
    }
    result = goodput.breakdown_of(timeline, info)
    assert result.wall_s == pytest.approx(225)
    assert summed(result) == pytest.approx(result.wall_s, rel=1e-9)
    assert result.good_s == pytest.approx(90)  # 100 s of windows less the save and the eval inside them
    assert result.badput["provision"] == pytest.approx(60) and result.badput["setup"] == pytest.approx(30)
    assert result.badput["launch"] == pytest.approx(2)  # the trainer's start-up owns the rest of the launch
    assert result.badput["checkpoint_save"] == pytest.approx(7) and result.badput["eval"] == pytest.approx(6)
    # the export's tail after run.json's end is still counted
    assert result.badput["other"] == pytest.approx(5)
    assert "lost" not in result.badput and result.steps_lost == 0
    assert result.summary().startswith("goodput 40% of 3m45s (badput: provision 1m00s, setup 30s")


def test_a_preempted_run_loses_the_steps_redone_after_its_checkpoint() -> None:
    # steps 0..70 by t=90, saved at 50
    first = [ev("startup", 0, 20, 1, step=0)] + windows(1, 20, 0, 70, 10, 10)
    first += [ev("checkpoint_save", 70, 2, 1, step=50, reason="periodic")]
    gap = [
        ev("recovery_wait", 100, 30, 2),
        ev("provision", 130, 40, 2),
        ev("setup", 170, 20, 2),
        ev("launch", 190, 3, 2),
    ]
    second = [ev("checkpoint_restore", 192, 5, 2, step=50), ev("startup", 192, 15, 2, step=50)]
    second += windows(2, 207, 50, 100, 10, 10)  # to t=257
    info = {
        "status": "finished",
        "attempts": [{"started": T0, "ended": T0 + 95}, {"started": T0 + 190, "ended": T0 + 260}],
        "ended": T0 + 260,
    }
    result = goodput.breakdown_of(first + gap + second, info)
    assert result.steps_lost == 20  # 51..70 trained twice
    assert abs(summed(result) - result.wall_s) <= 1e-3 * result.wall_s
    # the two windows after step 50, less the save inside one
    assert result.badput["lost"] == pytest.approx(18)
    assert result.badput["idle"] == pytest.approx(5)  # 95..100: the attempt had ended, no back-off yet
    assert result.badput["recovery_wait"] == pytest.approx(30)
    assert result.badput["checkpoint_restore"] == pytest.approx(5) and result.badput[
        "startup"
    ] == pytest.approx(30)
    assert result.good_s == pytest.approx(50 + 50) and result.badput["checkpoint_save"] == pytest.approx(2)
    assert result.attempts == 2 and result.as_dict()["steps_lost"] == 20


def test_a_gap_between_attempts_that_no_event_explains_is_idle() -> None:
    timeline = [ev("startup", 0, 10, 1, step=0)] + windows(1, 10, 0, 20, 10, 10)
    timeline += [ev("startup", 1000, 10, 2, step=20)] + windows(2, 1010, 20, 40, 10, 10)
    info = {"status": "running", "attempts": [{"started": T0, "ended": T0 + 30}, {"started": T0 + 1000}]}
    result = goodput.breakdown_of(timeline, info, now=T0 + 1030)
    assert result.badput["idle"] == pytest.approx(970)
    assert result.steps_lost == 0 and result.good_s == pytest.approx(40)
    assert summed(result) == pytest.approx(result.wall_s)
    assert result.goodput == pytest.approx(40 / 1030)


def test_data_waits_come_out_of_the_windows_and_markers_take_no_time() -> None:
    timeline = [
        ev("startup", 0, 10, step=0),
        ev("steps", 10, 20, from_step=0, to_step=10, data_wait_s=5.0),
        ev("checkpoint_ask", 15, 0, id="1", at_step=5),
        ev("startup", 0, 0, external_goodput="job-7"),
    ]
    result = goodput.breakdown_of(timeline, {"status": "finished", "ended": T0 + 30})
    assert result.badput["data_wait"] == pytest.approx(5) and result.good_s == pytest.approx(15)
    assert result.external == "job-7" and "ml-goodput-measurement (job-7)" in result.summary()


def test_the_loop_records_its_phases_and_a_resumed_attempt_is_judged_by_its_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TPUFT_RESUME", raising=False)
    monkeypatch.setenv("TPUFT_ATTEMPT", "1")
    run_dir = tmp_path / "run"
    cfg = recipe(steps=10, log_every=2, eval_every=None, checkpoint_every=4)
    first = start(run_dir, cfg)
    loop_mod.train(first, Hooks(first))  # "preempted" after step 10's row: checkpoints 4 and 8
    events.close()
    monkeypatch.setenv("TPUFT_RESUME", "1")
    monkeypatch.setenv("TPUFT_ATTEMPT", "2")
    again = start(run_dir, cfg)
    loop_mod.run(again, Hooks(again))
    lines = [json.loads(line) for line in events.events_file(run_dir, 0, 1).read_text().splitlines()]
    assert [e["kind"] for e in lines] == [
        "startup",
        "steps",
        "steps",
        "checkpoint_save",
        "steps",
        "steps",
        "checkpoint_save",
        "steps",
    ]
    assert [(e["from_step"], e["to_step"]) for e in lines if e["kind"] == "steps"] == [
        (0, 2),
        (2, 4),
        (4, 6),
        (6, 8),
        (8, 10),
    ]
    assert lines[3]["reason"] == "periodic" and lines[0]["attempt"] == 1
    second = [json.loads(line) for line in events.events_file(run_dir, 0, 2).read_text().splitlines()]
    kinds = [e["kind"] for e in second]
    assert kinds[0] == "checkpoint_restore" and second[0]["step"] == 8 and "export" in kinds
    assert [e["reason"] for e in second if e["kind"] == "checkpoint_save"] == ["final"]
    now = max(e["t"] + e["s"] for e in lines + second) + 1
    info = {
        "status": "finished",
        "attempts": [
            {"started": lines[0]["t"], "ended": lines[-1]["t"] + lines[-1]["s"]},
            {"started": second[0]["t"], "ended": now},
        ],
        "ended": now,
    }
    result = goodput.breakdown(open_storage(str(run_dir)), info)
    assert result.steps_lost == 2 and result.events == len(lines) + len(second)
    assert summed(result) == pytest.approx(result.wall_s, rel=1e-6)


def test_no_events_off_the_chief_or_with_recording_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TPUFT_RESUME", raising=False)
    cfg = recipe(steps=4, log_every=2, eval_every=None, checkpoint_every=None, export=False)
    other = start(tmp_path / "a", cfg, chief=False, worker=1)
    loop_mod.run(other, Hooks(other))
    monkeypatch.setenv(events.EVENTS_ENV, "0")
    off = start(tmp_path / "b", cfg)
    loop_mod.run(off, Hooks(off))
    assert (
        not (tmp_path / "a" / rundir.EVENTS_DIR).exists()
        and not (tmp_path / "b" / rundir.EVENTS_DIR).exists()
    )
    assert goodput.breakdown(open_storage(str(tmp_path / "b")), {}).summary() == "goodput: no events recorded"


def test_controller_events_never_raise_and_a_cluster_s_events_go_to_its_next_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    class Broken:
        def write_text(self, relpath: str, text: str) -> None:
            raise OSError("bucket unreachable")

    assert not goodput.record_controller_event(Broken(), "launch", T0, 3.0, 1)
    assert "goodput event launch not recorded: bucket unreachable" in capsys.readouterr().err
    state = tmp_path / "state"
    goodput.remember_cluster_event(state, "provision", T0, 40.0)
    goodput.remember_cluster_event(state, "setup", T0 + 40, 20.0)
    storage = open_storage(str(tmp_path / "run"))
    assert (
        goodput.adopt_cluster_events(state, storage, 1) == 2
        and goodput.adopt_cluster_events(state, storage, 1) == 0
    )
    assert goodput.record_controller_event(storage, "launch", T0 + 60, 2.0, 1)
    found = goodput.read_events(storage)
    assert [(e["kind"], e["attempt"]) for e in found] == [("provision", 1), ("setup", 1), ("launch", 1)]
    with pytest.raises(ValueError):
        goodput.controller_event("coffee_break", T0, 1.0, 1)


def test_runs_monitor_goodput_and_the_plot_show_the_breakdown_and_cost(cli, tmp_path: Path) -> None:
    from tests.rundirs import write_run

    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(f"provider: local\nbucket: {tmp_path / 'bucket'}\n")
    timeline = [ev("provision", 0, 60), ev("startup", 60, 30, step=0)] + windows(1, 90, 0, 100, 10, 30)
    run = tmp_path / "bucket" / "runs" / "alpha-1"
    write_run(
        run,
        info={
            "recipe": "alpha",
            "backend": "torch_xla",
            "workers": 1,
            "total_steps": 100,
            "status": "finished",
            "started": T0 + 60,
            "ended": T0 + 400,
            "accelerator": "v5litepod-8",
            "pricing": "spot",
            "attempts": [{"attempt": 1, "started": T0 + 60, "ended": T0 + 400}],
        },
        metrics=[{"step": s, "loss": 1.0 / s, "lr": 1e-3} for s in range(10, 101, 10)],
        files={
            "events/worker-0-attempt-1.jsonl": "".join(json.dumps(e) + "\n" for e in timeline[1:]).encode(),
            f"events/controller/{int(T0 * 1000)}-provision.json": json.dumps(timeline[0]).encode(),
        },
    )
    listed = cli("runs", "-c", str(cluster), "--json")
    assert listed.code == 0, listed.err
    row = json.loads(listed.out)[0]
    assert row["goodput"]["wall_s"] == 400 and row["goodput"]["goodput"] == 0.75  # 300 s of steps in 400 s
    assert row["goodput"]["badput"] == {"provision": 60.0, "startup": 30.0, "other": 10.0}
    assert row["cost"]["per_attempt"][0]["pricing"] == "spot"
    assert "75% (provision 1m" in cli("runs", "-c", str(cluster)).out
    shown = json.loads(cli("monitor", "alpha-1", "-c", str(cluster), "--json").out)
    assert shown["goodput"] == row["goodput"] and shown["cost"] == row["cost"]
    assert "goodput" in cli("monitor", "alpha-1", "-c", str(cluster), "--once").out
    total = json.loads(cli("goodput", "-c", str(cluster), "--json").out)
    assert total["runs"][0]["goodput"] == row["goodput"] and total["total"]["goodput"]["good_s"] == 300
    table = cli("goodput", "-c", str(cluster)).out
    assert "total (1 runs)" in table and "75%" in table
    plot = cli("monitor", "alpha-1", "-c", str(cluster), "--plot", str(tmp_path / "curves.png"))
    assert plot.code == 0, plot.err
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_the_train_summary_shows_goodput_and_cost(capsys: pytest.CaptureFixture[str]) -> None:
    from tpuft.cli.render import out_console, print_train_summary
    from tpuft.ops.train import TrainResult
    from tpuft.run.cost import run_cost

    info = {
        "status": "finished",
        "accelerator": "v4-8",
        "pricing": "on-demand",
        "chips": 4,
        "ended": T0 + 100,
        "attempts": [{"attempt": 1, "started": T0, "ended": T0 + 100}],
    }
    result = TrainResult(
        "r-1",
        "/runs/r-1",
        100.0,
        1,
        goodput=goodput.breakdown_of([ev("startup", 0, 20, step=0)] + windows(1, 20, 0, 80, 10, 10), info),
        cost=run_cost(info),
    )
    print_train_summary(out_console(), result, json_out=True)
    shown = json.loads(capsys.readouterr().out)
    assert shown["goodput"]["goodput"] == 0.8 and shown["goodput"]["badput"] == {"startup": 20.0}
    assert shown["cost"]["per_attempt"][0]["chips"] == 4
    print_train_summary(out_console(), result, json_out=False)
    table = capsys.readouterr().out
    assert "80% of 1m40s (badput: startup 20s)" in table and "cost so far" in table


def test_the_users_own_goodput_recording_is_noticed_by_flag_or_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys
    import types

    monkeypatch.delenv(events.EXTERNAL_ENV, raising=False)
    monkeypatch.delitem(sys.modules, events.EXTERNAL_MODULE, raising=False)
    assert events.external_recorder() is None
    monkeypatch.setitem(sys.modules, events.EXTERNAL_MODULE, types.ModuleType(events.EXTERNAL_MODULE))
    assert events.external_recorder() == "ml_goodput_measurement"
    monkeypatch.setenv(events.EXTERNAL_ENV, "my-job")
    assert events.external_recorder() == "my-job"


def test_a_queued_resource_s_wait_for_capacity_is_told_apart_from_its_provisioning() -> None:
    timeline = [ev("provision", 0, 100), ev("queue_wait", 0, 70), ev("startup", 100, 10, step=0)] + windows(
        1, 110, 0, 10, 10, 10
    )
    result = goodput.breakdown_of(timeline, {"status": "finished", "ended": T0 + 120})
    assert result.badput["queue_wait"] == pytest.approx(70) and result.badput["provision"] == pytest.approx(
        30
    )
    assert "queue 1m10s" in result.summary()


def test_the_cluster_file_may_set_the_goodput_switches_and_no_other_tpuft_variable(tmp_path: Path) -> None:
    from tpuft.config import load_cluster
    from tpuft.core.errors import ConfigError

    path = tmp_path / "tpuft.yaml"
    path.write_text("name: c\nworker_env:\n  TPUFT_EVENTS: '0'\n  TPUFT_GOODPUT_EXTERNAL: my-job\n")
    assert load_cluster(path).value.worker_env == {"TPUFT_EVENTS": "0", "TPUFT_GOODPUT_EXTERNAL": "my-job"}
    path.write_text("name: c\nworker_env:\n  TPUFT_ATTEMPT: '3'\n")
    with pytest.raises(ConfigError, match="TPUFT_ATTEMPT is set by tpuft"):
        load_cluster(path)
