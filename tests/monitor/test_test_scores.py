"""Where the test evaluation (``data.test``) shows up on the controller: run.json (finalized from the final
heartbeats), the snapshot behind ``runs`` and ``monitor`` and their ``--json``, the train summary; from the
metrics row, or from the heartbeats of a run whose metrics are TensorBoard events."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from tests.rundirs import write_run
from tpuft.cli.render import print_train_summary
from tpuft.ops.train import TrainResult
from tpuft.readers.runs import snapshot
from tpuft.run import rundir
from tpuft.storage import LocalStorage

TEST = {
    "test_exact_match": 0.984,
    "test_bleu": 97.5,
    "test_rouge_l": 99.1,
    "test_examples": 500,
    "test_seconds": 4.2,
    "test_checkpoint_step": 1200,
}


def finished_run(root: Path, *, metrics_row: bool, beat_test: bool = True) -> Path:
    run = root / "runs" / "numbers-1"
    rows = [
        {"step": 1500, "loss": 0.01, "elapsed_s": 60.0},
        {"step": 1500, "eval_loss": 0.1, "eval_exact_match": 0.97},
        {"step": 1200, "eval_loss": 0.09, "eval_exact_match": 0.98},
    ]
    write_run(
        run,
        info={
            "recipe": "numbers",
            "backend": "torch_xla",
            "workers": 2,
            "total_steps": 1500,
            "status": "running",
            "attempt": 1,
            "attempts": [{"attempt": 1, "started": 10.0}],
        },
        metrics=sorted(rows, key=lambda r: r["step"]) + ([{"step": 1500, **TEST}] if metrics_row else []),
        beats={
            w: {"step": 1500, "status": "finished", "age": 1.0, **(TEST if beat_test else {})}
            for w in range(2)
        },
    )
    return run


def test_finalized_run_json_carries_the_test_and_every_reader_shows_it(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = finished_run(tmp_path / "bucket", metrics_row=True)
    storage = LocalStorage(run)
    for worker in range(2):
        storage.write_text(
            rundir.attempt_record(1, worker),
            json.dumps({"worker": worker, "status": "finished", "ended": 11.0, "final": True}),
        )
    final = rundir.finalize_run(storage, 1)
    assert final is not None and final["status"] == "finished" and final["test"] == TEST
    assert json.loads((run / rundir.RUN_INFO).read_text())["test"] == TEST

    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(f"provider: local\nbucket: {tmp_path / 'bucket'}\n")
    listed = cli("runs", "-c", str(cluster), "--json")
    assert listed.code == 0, listed.err
    assert json.loads(listed.out)[0]["test"] == TEST
    table = cli("runs", "-c", str(cluster))
    assert table.code == 0 and "exact_match 0.9840 @1200" in table.out, table.out
    watched = cli("monitor", "-c", str(cluster), "--json")
    assert json.loads(watched.out)["test"] == TEST and json.loads(watched.out)["best_metric"]["step"] == 1200
    view = cli("monitor", "-c", str(cluster), "--once")
    assert view.code == 0, view.err
    for shown in (
        "test exact match",
        "0.9840",
        "test bleu",
        "97.5000",
        "test checkpoint",
        "step 1200, 500 examples",
    ):
        assert shown in view.out, view.out


def test_a_run_without_a_metrics_row_reads_the_heartbeats_and_one_without_a_test_shows_none(
    tmp_path: Path,
) -> None:
    events_like = snapshot(finished_run(tmp_path / "a", metrics_row=False))
    assert events_like.test == TEST and events_like.as_json()["test"] == TEST
    untested = finished_run(tmp_path / "b", metrics_row=False, beat_test=False)
    assert snapshot(untested).test == {}
    storage = LocalStorage(untested)
    for worker in range(2):
        storage.write_text(
            rundir.attempt_record(1, worker),
            json.dumps({"worker": worker, "status": "finished", "final": True}),
        )
    assert "test" not in (rundir.finalize_run(storage, 1) or {"test": "not finalized"})


def test_the_train_summary_and_its_json_show_the_test_scores_and_their_checkpoint(capsys) -> None:  # type: ignore[no-untyped-def]
    result = TrainResult(
        "numbers-1",
        "/runs/numbers-1",
        61.0,
        2,
        last_train={"loss": 0.01},
        last_eval={"eval_exact_match": 0.97},
        test=TEST,
    )
    buffer = io.StringIO()
    print_train_summary(Console(file=buffer, width=200), result, json_out=False)
    text = buffer.getvalue()
    assert (
        "test exact match" in text
        and "0.9840" in text
        and "test rouge l" in text
        and "step 1200, 500 examples" in text
    )
    assert "test seconds" not in text  # the scores, not the bookkeeping
    untested = io.StringIO()
    print_train_summary(Console(file=untested, width=200), TrainResult("r", "/r", 1.0, 1), json_out=False)
    assert "test" not in untested.getvalue()
    print_train_summary(Console(file=io.StringIO()), result, json_out=True)
    assert json.loads(capsys.readouterr().out)["test"] == TEST
