"""TensorBoard events -> metrics rows (T5X layout with tensor summaries, tpuft's own simple_value events,
truncated and corrupt files), the PNG plot, and a real TensorBoard served on a local and a gs:// run (GCS
emulator).

Event files are written with TensorBoard's own writer and protos, the way clu/tf.summary (T5X) and tpuft's
worker write them; nothing is mocked except, in one test, which Python has TensorBoard installed.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.monitor.tb_files import WALL0, png_size, t5x_tb, write_events
from tests.rigs.gcs_emulator import GcsEmulator
from tpuft.core.errors import UsageError
from tpuft.ops.tensorboard import TensorBoardHandle
from tpuft.readers.tb_events import read_tb_metrics
from tpuft.run import rundir
from tpuft.run.rundir import MetricsLog

BUCKET = "tpuft-tb-runs"
# ---- reading -----------------------------------------------------------------------------------------------


def test_t5x_layout_with_tensor_summaries(tmp_path: Path) -> None:
    log = read_tb_metrics(t5x_tb(tmp_path / "tb"))
    assert log.notes == [] and log.files == 3
    assert [r["step"] for r in log.rows] == [100, 200, 300]
    first, second = log.rows[0], log.rows[1]
    assert first["loss"] == 4.5 and first["lr"] == 0.001  # learning_rate/current wins over the period's mean
    assert first["accuracy"] == 0.25 and first["examples_per_s"] == 128.0 and first["tokens_per_s"] == 8192.0
    assert first["steps_per_s"] == 2.0 and first["cross_ent_loss"] == 4.25 and first["timing/seconds"] == 50.0
    assert "config" not in first and "eval_loss" not in first
    assert second["loss"] == 2.25 and second["eval_loss"] == 1.5 and second["eval_accuracy"] == 0.75
    assert log.rows[2]["eval_accuracy"] == 0.875
    assert [r["step"] for r in log.train_rows] == [100, 200, 300]
    assert [r["step"] for r in log.eval_rows] == [200, 300]
    # elapsed_s: since the first event; a step's time comes from the train dir's event, not the eval's
    assert [r["elapsed_s"] for r in log.rows] == [0.0, 10.0, 20.0]
    assert log.rows[0]["time"] == WALL0
    assert list(first)[:3] == ["step", "loss", "lr"]
    json.dumps(log.rows)  # rows are plain JSON, like metrics.jsonl


def test_several_eval_tasks_are_prefixed_and_clashes_are_qualified(tmp_path: Path) -> None:
    tb = t5x_tb(tmp_path / "tb", tasks=("glue_cola", "glue_sst2"))
    log = read_tb_metrics(tb)
    row = log.rows[1]
    assert row["eval_glue_cola/loss"] == 1.5 and row["eval_glue_sst2/loss"] == 2.5
    assert row["eval_glue_cola/accuracy"] == 0.75 and "eval_loss" not in row

    one = t5x_tb(tmp_path / "one" / "tb")
    # seqio's inference eval of the same task: tags "eval/<metric>"; its accuracy keeps the plain column
    write_events(
        one / "inference_eval" / "mytask", [(300, {"eval/accuracy": 62.5, "eval/exact_match": 40.0})]
    )
    last = read_tb_metrics(one).rows[-1]
    assert last["eval_accuracy"] == 62.5 and last["eval_exact_match"] == 40.0
    assert last["eval_training_eval/accuracy"] == 0.875 and last["eval_loss"] == 1.0


def test_tpuft_worker_events_match_its_metrics_jsonl(tmp_path: Path) -> None:
    """tpuft's own worker writes simple_value scalars (train/<key>, eval/<key>) next to metrics.jsonl: same
    rows."""
    from tpuft.worker.metrics import MetricsWriter

    writer = MetricsWriter(tmp_path, chief=True)
    for step in (10, 20, 30):
        writer.log(
            step,
            {
                "loss": 3.5 / step,
                "lr": 0.0005,
                "examples_per_s": 64.0,
                "tokens_per_s": 4096.0,
                "elapsed_s": 1.5 * step,
            },
        )
    writer.log(
        30, {"eval_loss": 0.125, "eval_token_accuracy": 0.75, "eval_exact_match": 0.5, "eval_examples": 8}
    )
    writer.close()
    from_tb = read_tb_metrics(tmp_path / rundir.TB_DIR)
    merged: dict[int, dict[str, float]] = {}
    for row in rundir.read_metrics(tmp_path).rows:
        merged.setdefault(row["step"], {}).update({k: v for k, v in row.items() if k != "time"})
    assert from_tb.notes == []
    assert [{k: v for k, v in r.items() if k != "time"} for r in from_tb.rows] == [
        {k: pytest.approx(v, rel=1e-6) for k, v in merged[s].items()} for s in sorted(merged)
    ]
    assert from_tb.rows[-1]["elapsed_s"] == 45.0  # the logged column wins over the event's wall time


def test_truncated_corrupt_and_restarted_files_are_survived(tmp_path: Path) -> None:
    tb = t5x_tb(tmp_path / "tb")
    # a restart re-logged step 300 (and went on to 400) in a newer file: the newer value wins
    newer = write_events(tmp_path / "restart", [(300, {"loss": 0.5}), (400, {"loss": 0.25})])
    shutil.move(newer, tb / "train" / "events.out.tfevents.9999999999.host.1.0")
    # a copy of a good file cut mid-record (a writer killed while flushing)
    whole = write_events(tmp_path / "whole", [(s, {"loss": 9.0}) for s in (500, 600, 700)])
    data = whole.read_bytes()
    (tb / "train" / "events.out.tfevents.9999999999.host.2.0").write_bytes(data[: len(data) - 7])
    # garbage under an event file's name, an empty file, and a half-downloaded mirror file (never read)
    (tb / "training_eval" / "mytask" / "events.out.tfevents.1.junk").write_bytes(
        b"\x07not a tfrecord at all" * 9
    )
    (tb / "train" / "events.out.tfevents.2.empty").write_bytes(b"")
    (tb / "train" / ".events.out.tfevents.3.x.tpuft-part").write_bytes(b"partial")
    log = read_tb_metrics(tb)
    steps = [r["step"] for r in log.rows]
    assert steps == [100, 200, 300, 400, 500, 600]  # 700 was in the cut record
    assert log.rows[2]["loss"] == 0.5 and log.rows[2]["eval_loss"] == 1.0 and log.rows[3]["loss"] == 0.25
    assert len(log.notes) == 2, log.notes
    # header + 2 events
    assert any("host.2.0: truncated or corrupt after 3 record(s)" in n for n in log.notes)
    assert any("1.junk: truncated or corrupt after 0 record(s)" in n for n in log.notes)


def test_missing_tb_dir_is_an_empty_log(tmp_path: Path) -> None:
    log = read_tb_metrics(tmp_path / "nope")
    assert log.rows == [] and "no such folder" in log.notes[0]


def test_modules_do_not_import_tensorboard_or_matplotlib_at_import() -> None:
    code = (
        "import sys, tpuft.readers.tb_events, tpuft.readers.plot, tpuft.ops.tensorboard\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorboard', 'matplotlib', "
        "'numpy'))\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


# ---- plotting --------------------------------------------------------------------------------------------


def synthetic_log(steps: int = 5000, eval_every: int = 250) -> MetricsLog:
    rows = []
    for step in range(1, steps + 1):
        row: dict[str, float] = {
            "step": step,
            "loss": 8 * math.exp(-step / 900) + 0.05 * math.sin(step) + 0.3,
        }
        if step % eval_every == 0:
            row |= {"eval_loss": row["loss"] + 0.1, "eval_token_accuracy": 1 - math.exp(-step / 1500)}
            row["eval_exact_match"] = 1 - math.exp(-step / 3000)
            row["eval_examples"] = 64
        rows.append(row)
    return MetricsLog(rows=rows)


def test_plot_of_5000_steps_is_a_1200x800_png_in_under_5_s(tmp_path: Path) -> None:
    import matplotlib.figure  # noqa: F401 - the one-off import (and font cache) is not the drawing being timed

    from tpuft.readers.plot import plot_curves

    log = synthetic_log()
    out = tmp_path / "curves.png"
    started = time.perf_counter()
    written = plot_curves(log, out, title="demo-20260101-000000-0001")
    seconds = time.perf_counter() - started
    print(f"plot of {len(log.rows)} steps: {seconds:.2f} s")
    assert written == out and seconds < 5.0
    assert png_size(out.read_bytes()) == (1200, 800)
    assert out.stat().st_size > 20_000  # real curves, not an empty canvas
    assert [p.name for p in tmp_path.iterdir()] == ["curves.png"]  # no temporary file left


def test_plot_from_tensorboard_events_and_percent_metrics(tmp_path: Path) -> None:
    from tpuft.readers.plot import plot_curves

    tb = t5x_tb(tmp_path / "tb")
    write_events(
        tb / "inference_eval" / "mytask", [(200, {"eval/accuracy": 50.0}), (300, {"eval/accuracy": 75.0})]
    )
    out = plot_curves(read_tb_metrics(tb), tmp_path / "t5x.png", title="t5x run")
    assert png_size(out.read_bytes()) == (1200, 800)


def test_downsample_keeps_spikes_and_the_ends() -> None:
    from tpuft.readers.plot import MAX_POINTS, downsample

    steps = [float(s) for s in range(40_000)]
    values = [1.0] * 40_000
    values[12_345] = 50.0
    x, y = downsample(steps, values)
    assert len(x) <= MAX_POINTS and x[0] == 0.0 and x[-1] == 39_999.0 and max(y) == 50.0
    assert x == sorted(x)
    assert downsample(steps[:10], values[:10]) == (steps[:10], values[:10])


def test_plot_errors(tmp_path: Path) -> None:
    from tpuft.readers.plot import plot_curves

    with pytest.raises(UsageError, match="nothing to plot"):
        plot_curves(MetricsLog(), tmp_path / "a.png", title="empty")
    with pytest.raises(UsageError, match="nothing to plot"):
        plot_curves(
            MetricsLog(rows=[{"step": 1, "lr": 0.1}, {"step": 2, "loss": float("nan")}]),
            tmp_path / "b.png",
            title="x",
        )
    with pytest.raises(UsageError, match="does not exist"):
        plot_curves(synthetic_log(10), tmp_path / "missing" / "c.png", title="x")
    with pytest.raises(UsageError, match="is a folder"):
        plot_curves(synthetic_log(10), tmp_path, title="x")
    assert list(tmp_path.iterdir()) == []


# ---- serving ---------------------------------------------------------------------------------------------


def runs_listed(url: str, expected: list[str], timeout: float = 30.0) -> list[str]:
    """TensorBoard's run list once it has the ``expected`` runs (it loads the logdir on a thread after it
    answers)."""
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(url + "data/runs", timeout=10) as answer:
            runs = sorted(json.load(answer))
        if runs == expected or time.monotonic() > deadline:
            return runs
        time.sleep(0.2)


def loss_steps(url: str, *, until: int, timeout: float = 30.0) -> list[int]:
    """Steps of the train run's ``loss`` in TensorBoard, polled until ``until`` is among them (or time runs
    out)."""
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(
            url + "data/plugin/scalars/scalars?run=train&tag=loss", timeout=10
        ) as answer:
            steps = [int(point[1]) for point in json.load(answer)]
        if until in steps or time.monotonic() > deadline:
            return steps
        time.sleep(0.2)


def test_tensorboard_on_a_local_run(tmp_path: Path) -> None:
    from tpuft.ops.tensorboard import start_tensorboard

    run = tmp_path / "runs" / "demo-1"
    t5x_tb(run / rundir.TB_DIR)
    started = time.perf_counter()
    handle = start_tensorboard(run)
    try:
        print(f"TensorBoard answered after {time.perf_counter() - started:.1f} s at {handle.url}")
        assert handle.url.startswith("http://127.0.0.1:") and handle.logdir == run / rundir.TB_DIR
        assert runs_listed(handle.url, ["train", "training_eval/mytask"]) == ["train", "training_eval/mytask"]
        with urllib.request.urlopen(handle.url + "data/plugin/scalars/tags", timeout=10) as answer:
            tags = json.load(answer)
        assert "learning_rate/current" in tags["train"] and "accuracy" in tags["training_eval/mytask"]
    finally:
        handle.stop()
    assert handle.process.poll() is not None and not handle.running
    handle.stop()  # twice is fine


def test_tensorboard_refuses_a_run_without_events(tmp_path: Path) -> None:
    from tpuft.ops.tensorboard import start_tensorboard

    (tmp_path / "run").mkdir()
    with pytest.raises(UsageError, match="has no TensorBoard events"):
        start_tensorboard(tmp_path / "run")
    with pytest.raises(UsageError, match="no such run dir"):
        start_tensorboard(tmp_path / "absent")


def test_tensorboard_found_in_a_backend_venv_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    from tpuft.ops import tensorboard as tb_ops

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tensorboard" else real_find_spec(name, *a),
    )
    monkeypatch.setenv("TPUFT_VENV_CACHE", str(tmp_path / "venvs"))
    with pytest.raises(UsageError, match="TensorBoard is not installed") as caught:
        tb_ops.tensorboard_command()
    assert "pip install" in str(caught.value)
    exe = tmp_path / "venvs" / "torch-abc123" / "bin" / "tensorboard"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert tb_ops.tensorboard_command() == [str(exe)]


def test_tensorboard_that_dies_reports_its_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tpuft.core.errors import TpuftError
    from tpuft.ops import tensorboard as tb_ops

    fake = tmp_path / "fake-tensorboard"
    fake.write_text("#!/bin/sh\necho 'E0101 something broke: port in use' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(tb_ops, "tensorboard_command", lambda: [str(fake)])
    (tmp_path / "run" / "tb").mkdir(parents=True)
    with pytest.raises(TpuftError, match="exited with code 3") as caught:
        tb_ops.start_tensorboard(tmp_path / "run")
    assert "something broke" in str(caught.value)


def wait_syncs(handle: TensorBoardHandle, count: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while handle.syncs < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert handle.syncs >= count, f"{handle.syncs} syncs in {timeout} s (last error: {handle.sync_error})"


def test_tensorboard_on_a_bucket_run_mirrors_and_resyncs(tmp_path: Path, gcs: GcsEmulator) -> None:
    from tpuft.core.paths import tpuft_home
    from tpuft.ops.tensorboard import start_tensorboard
    from tpuft.storage import open_storage

    gcs.reset()
    bucket = open_storage(f"gs://{BUCKET}")
    bucket.ensure_bucket("us-central2")
    run_id = "t5x-20260101-000000-0001"
    bucket.upload_tree(t5x_tb(tmp_path / "tb"), f"runs/{run_id}/tb")
    handle = start_tensorboard(f"gs://{BUCKET}/runs/{run_id}/", sync_interval_s=0.3)
    try:
        # the run's one mirror
        assert handle.logdir == tpuft_home() / "runs" / BUCKET / "runs" / run_id / "tb"
        assert runs_listed(handle.url, ["train", "training_eval/mytask"]) == ["train", "training_eval/mytask"]
        # the run goes on: a new eval task appears in the bucket and reaches the mirror on a later sync
        new = write_events(tmp_path / "later" / "training_eval" / "othertask", [(400, {"loss": 0.5})])
        bucket.upload_file(new, f"runs/{run_id}/tb/training_eval/othertask/{new.name}")
        wait_syncs(handle, handle.syncs + 2)  # one whole sync begun after the upload
        mirrored = handle.logdir / "training_eval" / "othertask" / new.name
        assert mirrored.read_bytes() == new.read_bytes()
        assert handle.sync_error is None
        everything = ["train", "training_eval/mytask", "training_eval/othertask"]
        assert runs_listed(handle.url, everything) == everything
        # the train file grows in the bucket (step 400 appended); the mirror replaces it and TensorBoard sees
        # the step (the newest file by name: the one a live writer appends to, and the only one TensorBoard
        # keeps tailing)
        train_file = max((tmp_path / "tb" / "train").glob("*tfevents*"), key=lambda p: p.name)
        grown = (
            train_file.read_bytes() + write_events(tmp_path / "more", [(400, {"loss": 0.125})]).read_bytes()
        )
        (tmp_path / "grown").mkdir()
        (tmp_path / "grown" / train_file.name).write_bytes(grown)
        bucket.upload_file(tmp_path / "grown" / train_file.name, f"runs/{run_id}/tb/train/{train_file.name}")
        assert loss_steps(handle.url, until=400)[-1] == 400
    finally:
        handle.stop()
    assert not handle.running and not handle._thread.is_alive()  # type: ignore[union-attr]
