"""tpuft runs, tpuft logs (time-ordered interleaving, one worker, following a live run) and the monitor's
views, on a local run folder; and a bucket run on the GCS emulator."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from tests.rigs.gcs_emulator import GcsEmulator
from tests.rundirs import write_run as build_run
from tpuft.config import load_cluster
from tpuft.ops.logs import LogLine, follow, in_time_order, open_run_logs, parse_line
from tpuft.run import rundir
from tpuft.run.rundir import log_timestamp
from tpuft.storage import open_storage


def write_run(
    bucket: Path,
    run_id: str,
    *,
    status: str,
    steps: int,
    evals: list[tuple[int, float]],
    beat_age: float = 1.0,
    started: float = 1_790_000_000.0,
) -> Path:
    run = bucket / "runs" / run_id
    rows = [
        {
            "step": s,
            "loss": 3.0 - s / 50,
            "lr": 1e-3,
            "examples_per_s": 250.0,
            "tokens_per_s": 9800.0,
            "elapsed_s": s / 2,
        }
        for s in range(10, steps + 1, 10)
    ]
    rows += [{"step": s, "eval_loss": 1.0, "eval_exact_match": m} for s, m in evals]
    build_run(
        run,
        info={
            "recipe": run_id.split("-")[0],
            "backend": "torch_xla",
            "workers": 2,
            "total_steps": 100,
            "status": status,
            "started": started,
        },
        metrics=sorted(rows, key=lambda r: r["step"]),
        beats={w: {"step": steps, "status": status, "age": beat_age, "loss": 1.0} for w in range(2)},
    )
    return run


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    path = tmp_path / "tpuft.yaml"
    path.write_text(f"provider: local\nbucket: {tmp_path / 'bucket'}\n")
    return path


def test_runs_lists_status_steps_and_best_eval(cli, cluster: Path, tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    write_run(
        bucket, "alpha-1", status="finished", steps=100, evals=[(50, 0.4), (100, 0.9)], started=1_790_000_000
    )
    write_run(bucket, "beta-2", status="failed", steps=30, evals=[], started=1_790_000_100)
    write_run(
        bucket, "gamma-3", status="running", steps=60, evals=[(50, 0.7)], beat_age=900, started=1_790_000_200
    )
    result = cli("runs", "-c", str(cluster), "--json")
    assert result.code == 0, result.err
    found = {r["run_id"]: r for r in json.loads(result.out)}
    assert [found[k]["status"] for k in ("alpha-1", "beta-2", "gamma-3")] == ["finished", "failed", "stale"]
    assert found["alpha-1"]["best_metric"] == {"name": "eval_exact_match", "value": 0.9, "step": 100}
    assert found["beta-2"]["best_metric"] is None and found["beta-2"]["step"] == 30
    assert found["gamma-3"]["stale_for_s"] >= 890
    table = cli("runs", "-c", str(cluster))
    assert table.code == 0
    assert (
        "alpha-1" in table.out and "eval_exact_match 0.9000 @100" in table.out and "stale (15m" in table.out
    )


def test_monitor_once_shows_workers_log_tails_and_node(cli, cluster: Path, tmp_path: Path) -> None:
    run = write_run(tmp_path / "bucket", "alpha-1", status="running", steps=40, evals=[])
    (run / "logs").mkdir()
    (run / "logs" / "worker-0.log").write_text(f"{log_timestamp()} [tpuft] step 40/100 loss 2.2\n")
    (run / "logs" / "worker-1.log").write_text(f"{log_timestamp()} still warming up\n\n")
    result = cli("monitor", "-c", str(cluster), "--once")
    assert result.code == 0, result.err
    assert (
        "step 40/100" in result.out
        and "still warming up" in result.out
        and "[tpuft] step 40/100 loss 2.2" in result.out
    )
    snap = json.loads(cli("monitor", "-c", str(cluster), "--json").out)
    assert snap["node_state"] == "NOT_FOUND"  # no local cluster was created in this test
    assert [w["last_log_line"] for w in snap["workers"]] == [
        "[tpuft] step 40/100 loss 2.2",
        "still warming up",
    ]
    assert snap["eta_s"] == 30.0 and snap["workers"][0]["loss"] == 1.0


def test_log_lines_interleave_by_arrival_time() -> None:
    w0 = [parse_line(0, b"2026-11-22T06:00:00.100Z a"), parse_line(0, b"2026-11-22T06:00:02.000Z c")]
    w1 = [parse_line(1, b"2026-11-22T06:00:01.000Z b"), parse_line(1, b"2026-11-22T06:00:03.000Z d")]
    assert [line.text for line in in_time_order([w0, w1])] == ["a", "b", "c", "d"]
    assert parse_line(3, b"no stamp here") == LogLine(3, None, "no stamp here")
    assert w1[0].render(prefix=True, timestamps=True) == "2026-11-22T06:00:01.000Z [w1] b"


def test_logs_cli_all_workers_and_one(cli, cluster: Path, tmp_path: Path) -> None:
    run = write_run(tmp_path / "bucket", "alpha-1", status="finished", steps=100, evals=[])
    (run / "logs").mkdir()
    (run / "logs" / "worker-0.log").write_text(
        "2026-11-22T06:00:00.000Z zero-a\n2026-11-22T06:00:02.000Z zero-b\n"
    )
    (run / "logs" / "worker-1.log").write_text("2026-11-22T06:00:01.000Z one-a\n")
    result = cli("logs", "alpha", "-c", str(cluster))
    assert result.code == 0, result.err
    assert result.out.splitlines() == ["[w0] zero-a", "[w1] one-a", "[w0] zero-b"]
    one = cli("logs", "alpha", "-c", str(cluster), "--worker", "1", "-t")
    assert one.out.splitlines() == ["2026-11-22T06:00:01.000Z one-a"]  # one worker: no prefix
    missing = cli("logs", "alpha", "-c", str(cluster), "--worker", "5")
    assert missing.code == 2 and "no log for worker 5" in missing.err and "0, 1" in missing.err


def test_a_multislice_run_is_labelled_and_addressed_slice_by_slice(
    cli, cluster: Path, tmp_path: Path
) -> None:
    """run.json's ``slices``: monitor labels the workers ``S:I``, logs prefixes ``[wN S:I]`` and takes
    ``--worker S:I``; a run without it stays flat (the tests above)."""
    build_run(
        tmp_path / "bucket" / "runs" / "multi-1",
        info={
            "recipe": "multi",
            "backend": "t5x",
            "workers": 4,
            "slices": 2,
            "total_steps": 10,
            "status": "finished",
        },
        metrics=[{"step": 10, "loss": 1.0}],
        beats={w: {"step": 10, "status": "finished", "age": 1.0} for w in range(4)},
        logs={w: f"2026-11-22T06:00:0{w}.000Z from {w}\n".encode() for w in range(4)},
    )
    view = cli("monitor", "multi", "-c", str(cluster), "--once")
    assert view.code == 0, view.err
    assert all(f"{w // 2}:{w % 2} (w{w})" in view.out for w in range(4))
    data = json.loads(cli("monitor", "multi", "-c", str(cluster), "--json").out)
    assert [(w["index"], w["slice"], w["host"], w["ref"]) for w in data["workers"]] == [
        (0, 0, 0, "0:0"),
        (1, 0, 1, "0:1"),
        (2, 1, 0, "1:0"),
        (3, 1, 1, "1:1"),
    ]
    assert cli("logs", "multi", "-c", str(cluster)).out.splitlines() == [
        "[w0 0:0] from 0",
        "[w1 0:1] from 1",
        "[w2 1:0] from 2",
        "[w3 1:1] from 3",
    ]
    assert cli("logs", "multi", "-c", str(cluster), "-w", "1:0").out.splitlines() == ["from 2"]
    assert cli("logs", "multi", "-c", str(cluster), "-w", "3").out.splitlines() == ["from 3"]
    wrong = cli("logs", "multi", "-c", str(cluster), "-w", "2:0")
    assert (
        wrong.code == 2
        and "no slice 2 (the cluster has slices 0..1 of 2 hosts (0..1), workers 0..3)" in wrong.err
    )
    many = cli("logs", "multi", "-c", str(cluster), "-w", "1:*")
    assert many.code == 2 and "this command takes one worker" in many.err


def test_follow_prints_lines_as_they_arrive_and_stops_when_the_run_ends(
    cluster: Path, tmp_path: Path
) -> None:
    run = write_run(tmp_path / "bucket", "live-1", status="running", steps=10, evals=[])
    logs_dir = run / "logs"
    logs_dir.mkdir()
    (logs_dir / "worker-0.log").write_text(f"{log_timestamp()} first\n")
    run_logs = open_run_logs(load_cluster(cluster).value, "live-1")
    run_logs.poll_seconds = 0.05
    seen: list[tuple[float, str]] = []

    def writer() -> None:
        time.sleep(0.3)
        with (logs_dir / "worker-0.log").open("a") as handle:
            handle.write(f"{log_timestamp()} second\n{log_timestamp()} half")
        # a worker whose log appears later
        (logs_dir / "worker-1.log").write_text(f"{log_timestamp()} late worker\n")
        time.sleep(0.3)
        with (logs_dir / "worker-0.log").open("a") as handle:
            handle.write(" a line\n")
        info = json.loads((run / rundir.RUN_INFO).read_text())
        rundir.write_json_atomic(run / rundir.RUN_INFO, {**info, "status": "finished"})

    started = time.monotonic()
    thread = threading.Thread(target=writer)
    thread.start()
    follow(run_logs, lambda line: seen.append((time.monotonic() - started, f"w{line.worker} {line.text}")))
    thread.join()
    texts = [t for _, t in seen]
    assert texts == ["w0 first", "w0 second", "w1 late worker", "w0 half a line"]
    assert seen[0][0] < 0.25 and seen[1][0] >= 0.3  # printed as it arrived, not at the end


def test_bucket_run_monitor_runs_and_logs(
    cli, gcs: GcsEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the unreachable TPU API below fails fast
    monkeypatch.setattr("tpuft.providers.gcp.tuning.RETRY_BASE_S", 0.01)
    local = write_run(tmp_path / "staging", "remote-1", status="running", steps=20, evals=[(20, 0.5)])
    (local / "logs").mkdir()
    (local / "logs" / "worker-0.log").write_text("2026-11-22T06:00:00.000Z hello from the bucket\n")
    storage = open_storage("gs://tpuft-runs-test")
    storage.ensure_bucket("us-central2")
    storage.upload_tree(local, "runs/remote-1")
    cluster = tmp_path / "gcp.yaml"
    cluster.write_text(
        "name: test-node\nprovider: gcp\naccelerator: v4-8\nbucket: gs://tpuft-runs-test\n"
        "gcp:\n  project: demo-project\n  zone: us-central2-b\n  tpu_api_endpoint: http://127.0.0.1:9\n"
    )
    snap = cli("monitor", "-c", str(cluster), "--json")
    assert snap.code == 0, snap.err
    data = json.loads(snap.out)
    assert data["run_dir"] == "gs://tpuft-runs-test/runs/remote-1" and data["step"] == 20
    assert data["node_state"].startswith("unknown")  # the TPU API is unreachable: shown, monitoring goes on
    assert data["workers"][0]["last_log_line"] == "hello from the bucket"
    listed = cli("runs", "-c", str(cluster), "--json")
    assert [r["run_id"] for r in json.loads(listed.out)] == ["remote-1"]
    logs = cli("logs", "remote-1", "-c", str(cluster))
    assert logs.code == 0, logs.err
    assert logs.out.splitlines() == ["[w0] hello from the bucket"]
    # following a bucket log: ranged reads pick up only what was appended since the last poll
    run_logs = open_run_logs(load_cluster(cluster).value, "remote-1")
    source = run_logs.sources[0]
    assert run_logs.poll_seconds == 5.0 and [line.text for line in source.poll()] == ["hello from the bucket"]
    with (local / "logs" / "worker-0.log").open("a") as handle:
        handle.write("2026-11-22T06:00:15.000Z uploaded 15 s later\n")
    storage.upload_file(local / "logs" / "worker-0.log", "runs/remote-1/logs/worker-0.log")
    assert [line.text for line in source.poll()] == ["uploaded 15 s later"]
    assert source.poll() == []


def test_t5x_style_run_with_only_tensorboard_events(cli, cluster: Path, tmp_path: Path) -> None:
    """A backend that writes no metrics.jsonl (T5X): monitor, runs and --plot read its TensorBoard events."""
    from tests.monitor.tb_files import png_size, t5x_tb

    run = tmp_path / "bucket" / "runs" / "t5x-1"
    t5x_tb(run / rundir.TB_DIR)
    rundir.write_json_atomic(
        run / rundir.RUN_INFO,
        {
            "run_id": "t5x-1",
            "recipe": "t5x",
            "backend": "tb_only",
            "workers": 1,
            "total_steps": 1000,
            "status": "finished",
            "started": 1_790_000_000,
        },
    )
    result = cli("monitor", "t5x-1", "-c", str(cluster), "--json")
    assert result.code == 0, result.err
    snap = json.loads(result.out)
    assert snap["metrics_source"] == "tensorboard events" and snap["step"] > 0
    assert snap["last_train"]["loss"] > 0 and any(k.startswith("eval_") for k in snap["last_eval"])
    listed = json.loads(cli("runs", "-c", str(cluster), "--json").out)
    assert listed[0]["best_metric"] is not None
    plotted = cli("monitor", "t5x-1", "-c", str(cluster), "--plot", str(tmp_path / "curves.png"))
    assert plotted.code == 0, plotted.err
    assert png_size((tmp_path / "curves.png").read_bytes()) == (1200, 800)


def test_tensorboard_command_prints_the_url_and_stops_on_ctrl_c(cluster: Path, tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import urllib.request

    from tests.conftest import default_sigint
    from tests.monitor.tb_files import t5x_tb

    run = tmp_path / "bucket" / "runs" / "t5x-1"
    t5x_tb(run / rundir.TB_DIR)
    rundir.write_json_atomic(run / rundir.RUN_INFO, {"run_id": "t5x-1", "status": "finished"})
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpuft", "tensorboard", "-c", str(cluster), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "300"},
        preexec_fn=default_sigint,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "http://127.0.0.1:" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = line.split("http://", 1)[1].split()[0]
        with urllib.request.urlopen(f"http://{url.rstrip('/')}/data/runs", timeout=10) as answer:
            assert answer.status == 200 and "train" in answer.read().decode()
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0


def test_a_live_monitor_outlives_an_outage_of_the_network(
    cluster: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The live view (a terminal) keeps the last snapshot and says it cannot reach Google Cloud, instead of
    ending on one refresh's ``gcp.timeout``; it goes on when the bucket answers again. The outage is raised by
    a stand-in of ``tpuft.readers.monitor.watch`` (a bucket that stops answering is
    tests/providers/test_network_down.py)."""
    import io

    from rich.console import Console

    import tpuft.cli.results as results
    import tpuft.readers.monitor
    from tpuft.storage.network import CloudUnreachable

    run = write_run(tmp_path / "bucket", "delta-4", status="running", steps=40, evals=[])
    real_watch = tpuft.readers.monitor.watch
    calls: list[int] = []

    def flaky_watch(config, run_):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) in (2, 3):
            raise CloudUnreachable(
                "reading gs://b/runs/delta-4/run.json: no answer from the Cloud Storage API for 30s"
            )
        if len(calls) == 4:
            info = json.loads((run / "run.json").read_text())
            (run / "run.json").write_text(json.dumps({**info, "status": "finished"}))
        return real_watch(config, run_)

    screen = io.StringIO()
    monkeypatch.setattr(tpuft.readers.monitor, "watch", flaky_watch)
    monkeypatch.setattr(results, "out_console", lambda: Console(file=screen, force_terminal=True, width=200))
    results.monitor("delta-4", once=False, interval=0.3, plot=None, config=cluster, json_out=False)
    assert len(calls) == 4
    assert "cannot reach Google Cloud (reading gs://b/runs/delta-4/run.json" in screen.getvalue()
    assert "finished" in screen.getvalue()
