"""monitor reads a run dir: progress, ETA, eval metrics, heartbeats (stale ones flagged), corrupt lines
skipped."""

from __future__ import annotations

import json
from pathlib import Path

from tests.rundirs import write_run
from tpuft.readers.runs import snapshot


def make_run(root: Path, *, beats: dict[int, float], lines: list[str]) -> Path:
    run = root / "runs" / "demo-1"
    write_run(
        run,
        info={
            "recipe": "demo",
            "backend": "torch_xla",
            "workers": 2,
            "total_steps": 100,
            "status": "running",
        },
        metrics_lines=lines,
        beats={worker: {"step": 50, "status": "running", "age": age} for worker, age in beats.items()},
    )
    return run


def test_snapshot_with_corrupt_lines_and_a_stale_worker(tmp_path: Path) -> None:
    lines = [
        json.dumps({"step": 25, "loss": 2.0, "elapsed_s": 10.0}),
        '{"step": 50, "loss": 1.',  # a worker killed mid-write
        "",
        json.dumps({"step": 50, "loss": 1.5, "elapsed_s": 20.0, "examples_per_s": 100.0}),
        json.dumps({"step": 50, "eval_loss": 1.2, "eval_exact_match": 0.4}),
    ]
    run = make_run(tmp_path, beats={0: 1.0, 1: 600.0}, lines=lines)
    snap = snapshot(run)
    assert snap.step == 50 and snap.total_steps == 100
    assert snap.last_train["loss"] == 1.5 and snap.last_eval["eval_exact_match"] == 0.4
    assert snap.skipped_lines == [2, 3]
    assert snap.eta_s == 20.0  # 20 s for 50 steps, 50 to go
    assert [w.stale for w in snap.workers] == [False, True]
    assert snap.status == "running"


def test_all_workers_silent_means_stale(tmp_path: Path) -> None:
    run = make_run(tmp_path, beats={0: 900.0, 1: 900.0}, lines=[json.dumps({"step": 1, "loss": 3.0})])
    assert snapshot(run).status == "stale"


def test_cli_monitor_json_and_unknown_run(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(f"provider: local\nbucket: {tmp_path / 'bucket'}\n")
    make_run(
        tmp_path / "bucket",
        beats={0: 1.0, 1: 1.0},
        lines=[json.dumps({"step": 10, "loss": 3.0, "elapsed_s": 5})],
    )
    result = cli("monitor", "-c", str(cluster), "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["step"] == 10
    table = cli("monitor", "demo", "-c", str(cluster))
    assert table.code == 0 and "demo-1" in table.out
    missing = cli("monitor", "nope", "-c", str(cluster))
    assert missing.code == 2 and "does not exist" in missing.err and "demo-1" in missing.err
