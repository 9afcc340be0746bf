"""The tracker sidecar (tpuft/worker/tracking/sidecar.py) on synthetic run dirs, in the tracking venv, read
back with the trackers' own readers: W&B offline inside the run dir, MLflow against a file store, SQLite and a
local ``mlflow server``; a resumed run continuing the same runs without a row twice; trackers that cannot be
reached being warnings; and the chief's supervisor running it beside a trainer. No training here (the e2e
quickstarts track a real one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.tracking_checks import check_tracking, read_back
from tests.tracking.rig import REPO, TRAIN, free_port, rows_in_order, run_sidecar, write_run_dir
from tpuft.config import load_recipe
from tpuft.core.errors import ConfigError
from tpuft.run import rundir

OFFLINE = {"mode": "offline", "project": "tpuft-tests", "tags": ["synthetic"]}


def test_bad_report_values_are_located(tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_text('{"source": "a", "target": "b"}\n')
    path = tmp_path / "r.yaml"
    path.write_text(
        "name: t\nbackend:\n  kind: torch_xla\nmodel:\n  config: {d_model: 8}\ndata:\n  train: train.jsonl\n"
        "train:\n  steps: 10\n  batch_size: 4\nreport:\n  to: [wandb, neptune, wandb]\n  wandb:\n    mode: "
        "sometimes\n"
        "    project: 'has space'\n  mlflow:\n    tracking_uri: ftp://host/x\n  samples: -1\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_recipe(path)
    problems = "\n".join(caught.value.problems)
    for line, key in (
        (12, "report.to[1]: must be one of tensorboard, wandb, mlflow"),
        (14, "report.wandb.mode"),
        (15, "report.wandb.project: 'has space'"),
        (17, "report.mlflow.tracking_uri: 'ftp://host/x'"),
        (18, "report.samples: must be >= 0"),
    ):
        assert f"{path}:{line}: {key}" in problems, problems
    twice = path.read_text().replace("neptune, ", "")
    path.write_text(twice)
    with pytest.raises(ConfigError, match="report.to: wandb listed twice"):
        load_recipe(path)
    fine = load_recipe(
        path,
        [
            "report.to=[mlflow, tensorboard]",
            "report.wandb.mode=offline",
            "report.wandb.project=p",
            "report.mlflow.tracking_uri=sqlite:///m.db",
            "report.samples=0",
        ],
    ).value.report
    assert (
        fine.trackers == ("mlflow",)
        and load_recipe(
            path,
            [
                "report.to=[tensorboard]",
                "report.wandb.mode=offline",
                "report.wandb.project=p",
                "report.mlflow.tracking_uri=file:x",
                "report.samples=1",
            ],
        ).value.report.trackers
        == ()
    )


def test_wandb_mode_from_the_environment_needs_no_api_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """W&B's own switch, ``WANDB_MODE`` (from ``worker_env``, which the sidecar gets as environment), turns a
    run offline or off as W&B would, and then no API key is asked for. The sink's own decision, made before
    wandb is imported: no tracking venv here."""
    from tpuft.worker.tracking.sinks import WandbSink

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))  # no key in a .netrc either

    def sink(mode: str | None) -> WandbSink:
        context = {"report": {"wandb": {"mode": mode} if mode else {}}, "tags": {}, "recipe": {}}
        return WandbSink({**context, "run_dir": tmp_path}, {})

    online = sink("online")
    assert online.mode == "online" and "no WANDB_API_KEY" in str(online.key_problem())
    with pytest.raises(RuntimeError, match="no WANDB_API_KEY"):  # what the sidecar retries, then gives up
        online.start()
    for switch, mode in (
        ("offline", "offline"),
        ("dryrun", "offline"),
        ("disabled", "disabled"),
        ("OFFLINE ", "offline"),
    ):
        monkeypatch.setenv("WANDB_MODE", switch)
        assert (sink("online").mode, sink(None).mode, sink("online").key_problem()) == (mode, mode, None), (
            switch
        )
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert sink("offline").mode == "disabled"
    monkeypatch.setenv("WANDB_MODE", "online")  # only down: a recipe's offline run stays offline
    assert sink("offline").mode == "offline" and sink("offline").key_problem() is None
    assert sink("online").key_problem() is not None
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert sink("online").key_problem() is None


@pytest.mark.slow
def test_wandb_offline_and_an_mlflow_file_store_hold_the_runs_curves(
    tracking_python: str, tmp_path: Path
) -> None:
    run_dir = write_run_dir(tmp_path / "run", {"wandb": OFFLINE, "mlflow": {"tracking_uri": "file:mlruns"}})
    done = run_sidecar(tracking_python, run_dir)
    assert done.returncode == 0 and "WARNING" not in done.stdout, done.stdout + done.stderr
    back = check_tracking(
        run_dir, python=tracking_python, run_id="synthetic-1", backend="torch_xla", accelerator="v4-8"
    )
    assert back["mlflow"]["status"] == "FINISHED" and back["wandb"][0]["exit_code"] == 0
    # 3 rows, in id order
    assert back["mlflow"]["tables"]["samples_test.json"]["data"][0][:3] == [
        0,
        "in 0",
        "p0",
    ]
    assert len(back["mlflow"]["tables"]["samples_test.json"]["data"]) == 3
    state = json.loads((run_dir / rundir.TRACKING).read_text())
    assert (run_dir / "mlruns").is_dir() and state["mlflow"]["tracking_uri"] == f"file:{run_dir / 'mlruns'}"
    assert state["wandb"]["dir"].startswith("wandb/offline-run-") and state["wandb"]["rows"] == len(
        rows_in_order()
    )
    sync = subprocess.run(
        [str(Path(tracking_python).parent / "wandb"), "sync", "--dry-run", state["wandb"]["dir"]],
        capture_output=True,
        text=True,
        cwd=run_dir,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("WANDB_")},
    )
    # `wandb sync` takes it later
    assert "Would sync 1 run" in sync.stdout + sync.stderr, sync.stdout + sync.stderr


@pytest.mark.slow
def test_a_resumed_run_continues_the_same_runs_and_sends_no_row_twice(
    tracking_python: str, tmp_path: Path
) -> None:
    """The first attempt stops after step 30; the second (its trainer restarted from checkpoint 20, so
    metrics.jsonl is cut back to step 20 and steps 30, 40 logged anew with other values) continues the same
    W&B and MLflow runs: step 30's first values stay, 40 and the test come once."""
    first = [r for r in rows_in_order() if r["step"] <= 30]
    run_dir = write_run_dir(
        tmp_path / "run", {"wandb": OFFLINE, "mlflow": {"tracking_uri": "sqlite:///tracking.db"}}, rows=first
    )
    assert run_sidecar(tracking_python, run_dir, stop="stopped").returncode == 0
    state = json.loads((run_dir / rundir.TRACKING).read_text())
    assert (
        state["mlflow"]["tracking_uri"] == f"sqlite:///{run_dir / 'tracking.db'}"
        and state["mlflow"]["outcome"] == "stopped"
    )
    kept = [r for r in first if r["step"] <= 20]
    redone = [{**r, "loss": r["loss"] + 1.0} if "loss" in r else r for r in rows_in_order() if r["step"] > 20]
    (run_dir / rundir.METRICS).write_text("".join(json.dumps(r) + "\n" for r in [*kept, *redone]))
    (run_dir / rundir.TRACKING_STOP).unlink()
    assert run_sidecar(tracking_python, run_dir).returncode == 0
    again = json.loads((run_dir / rundir.TRACKING).read_text())
    assert (
        again["wandb"]["id"] == state["wandb"]["id"]
        and again["mlflow"]["run_id"] == state["mlflow"]["run_id"]
    )
    expected = [*first, *[r for r in redone if r["step"] > 30]]
    back = check_tracking(
        run_dir, python=tracking_python, run_id="synthetic-1", backend="torch_xla", rows=expected
    )
    assert len(back["wandb"]) == 2 and back["mlflow"]["status"] == "FINISHED"
    assert again["mlflow"]["rows"] == len(expected) and back["mlflow"]["metrics"]["loss"] == [
        [r["step"], r["loss"]] for r in [*TRAIN[:3], {**TRAIN[3], "loss": TRAIN[3]["loss"] + 1.0}]
    ]


@pytest.mark.slow
def test_an_mlflow_server_on_loopback_gets_the_run(tracking_python: str, tmp_path: Path) -> None:
    port = free_port()
    # (a new SQLite store runs MLflow's migrations first; the sidecar's SQLite path is the resume test's)
    server = subprocess.Popen(
        [
            str(Path(tracking_python).parent / "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"file:{tmp_path / 'store'}",
            "--artifacts-destination",
            str(tmp_path / "artifacts"),
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "server.log").open("wb"),
        start_new_session=True,
        cwd=tmp_path,
        env={
            **os.environ,
            "MLFLOW_ALLOW_FILE_STORE": "true",
        },  # the server's own store: it starts in 10 s, not 60
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, (
                tmp_path / "server.log"
            ).read_text()[-3000:]
            time.sleep(0.5)
        run_dir = write_run_dir(tmp_path / "run", {"wandb": OFFLINE, "mlflow": {"experiment": "served"}})
        done = run_sidecar(tracking_python, run_dir, env={"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"})
        assert done.returncode == 0 and "WARNING" not in done.stdout, done.stdout + done.stderr
        back = check_tracking(run_dir, python=tracking_python, run_id="synthetic-1", backend="torch_xla")
        assert back["mlflow"]["experiment"] == "served"
        assert (
            json.loads((run_dir / rundir.TRACKING).read_text())["mlflow"]["tracking_uri"]
            == f"http://127.0.0.1:{port}"
        )
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


@pytest.mark.slow
def test_unreachable_trackers_are_warnings_and_never_the_runs_concern(
    tracking_python: str, tmp_path: Path
) -> None:
    closed = free_port()  # nothing listens there
    run_dir = write_run_dir(
        tmp_path / "run",
        {"wandb": {"mode": "online"}, "mlflow": {"tracking_uri": f"http://127.0.0.1:{closed}"}},
    )
    before = (run_dir / rundir.METRICS).read_text()
    done = run_sidecar(tracking_python, run_dir)
    assert done.returncode == 0, done.stderr
    assert "WARNING: wandb: start failed" in done.stdout and "WANDB_API_KEY" in done.stdout, done.stdout
    assert "WARNING: mlflow: start failed" in done.stdout, done.stdout
    assert "done (finished): wandb 0 rows, mlflow 0 rows" in done.stdout
    log = (run_dir / "logs" / "tracking.log").read_text()
    assert "WARNING tpuft.tracking: mlflow: start failed" in log
    assert (run_dir / rundir.METRICS).read_text() == before
    assert not (run_dir / "wandb").exists() and "run_id" not in json.loads(
        (run_dir / rundir.TRACKING).read_text()
    ).get("mlflow", {})


@pytest.mark.slow
def test_the_chiefs_supervisor_runs_the_sidecar_beside_its_trainer(
    tracking_python: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor proper, in this process, with a trainer that writes the synthetic rows: the sidecar's
    lines in worker 0's log, its state and the trackers' runs in run.json's ``tracking`` once the run is
    finalized."""
    from tpuft.config.tracking_env import PYTHON_ENV
    from tpuft.storage import LocalStorage
    from tpuft.worker.context import WorkerContext
    from tpuft.worker.supervisor.supervision import Supervisor

    run_dir = write_run_dir(tmp_path / "run", {"wandb": OFFLINE, "mlflow": {}}, rows=[])
    (run_dir / rundir.TEST_DIR / "predictions-00000.jsonl").unlink()
    storage = LocalStorage(run_dir)
    storage.write_text(
        rundir.RUN_INFO,
        json.dumps(
            {
                "run_id": "synthetic-1",
                "status": "running",
                "workers": 1,
                "attempt": 1,
                "accelerator": "v4-8",
                "attempts": [{"attempt": 1, "started": 1.0}],
            }
        ),
    )
    rows = "".join(json.dumps(r) + "\n" for r in rows_in_order())
    trainer = [
        sys.executable,
        "-c",
        f"import time; open({str(run_dir / rundir.METRICS)!r}, 'a').write({rows!r}); time.sleep(1)",
    ]
    for key, value in {
        "HOME": str(tmp_path / "home"),
        PYTHON_ENV: tracking_python,
        "PYTHONPATH": str(REPO),
        "TPUFT_TRACKING_POLL_SECONDS": "0.2",
        "TPUFT_RUN_ID": "synthetic-1",
        "TPUFT_RUN_DIR": str(run_dir),
        "TPUFT_WORKER_ID": "0",
        "TPUFT_NUM_WORKERS": "1",
    }.items():
        monkeypatch.setenv(key, value)
    for key in [k for k in os.environ if k.startswith(("WANDB_", "MLFLOW_"))]:
        monkeypatch.delenv(key)
    assert Supervisor(WorkerContext.from_env(), trainer, 1, 60.0, storage).run() == 0
    log = rundir.log_path(run_dir, 0).read_text()
    assert (
        "[tracking] forwarding metrics.jsonl to wandb, mlflow" in log and "[tracking] done (finished)" in log
    ), log
    info = json.loads(storage.read_text(rundir.RUN_INFO))
    assert info["status"] == "finished" and info["tracking"]["mlflow"]["rows"] == len(rows_in_order())
    assert info["tracking"]["wandb"]["mode"] == "offline" and "marks" not in info["tracking"]["wandb"]
    assert rundir.tracking_lines(info["tracking"])[0].startswith(
        f"wandb: tpuft-tests/{info['tracking']['wandb']['id']} "
        "(offline: wandb sync <run dir>/wandb/offline-run-"
    )
    back = read_back(tracking_python, run_dir)
    assert back["mlflow"]["metrics"]["loss"] == [[r["step"], r["loss"]] for r in TRAIN]
    assert back["mlflow"]["tags"]["tpuft.accelerator"] == "v4-8"


class Lines:
    """What the supervisor's TrainerOutput takes from the sidecar: its lines, kept here."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, raw: bytes) -> None:
        self.lines.append(raw.decode().rstrip("\n"))

    def say(self, message: str) -> None:
        self.lines.append(f"[supervisor] {message}")


@pytest.mark.slow
def test_a_recovered_chief_on_a_new_node_takes_the_state_from_the_bucket(
    tracking_python: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gs:// run dir: the chief writes a staging copy, and a new node's copy starts empty. The supervisor
    brings tracking.json back from the run dir (a local folder stands in for the bucket: the Storage interface
    is the same) before the sidecar starts, so the W&B run goes on under its id; a worker that is not the
    chief starts nothing."""
    from tpuft.config.tracking_env import PYTHON_ENV
    from tpuft.storage import LocalStorage
    from tpuft.worker.context import WorkerContext
    from tpuft.worker.tracking.launch import TrackingSidecar

    bucket = write_run_dir(
        tmp_path / "bucket", {"wandb": OFFLINE, "mlflow": {"tracking_uri": f"sqlite:///{tmp_path / 'm.db'}"}}
    )
    assert run_sidecar(tracking_python, bucket, stop="killed").returncode == 0  # the first node's attempt
    first = json.loads((bucket / rundir.TRACKING).read_text())
    staging = write_run_dir(
        tmp_path / "staging", {"wandb": OFFLINE, "mlflow": {"tracking_uri": f"sqlite:///{tmp_path / 'm.db'}"}}
    )
    monkeypatch.setenv(PYTHON_ENV, tracking_python)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("TPUFT_TRACKING_POLL_SECONDS", "0.1")
    for key in [k for k in os.environ if k.startswith(("WANDB_", "MLFLOW_"))]:
        monkeypatch.delenv(key)
    storage = LocalStorage(bucket)
    worker_1 = WorkerContext("synthetic-1", staging, 1, 2, "127.0.0.1:1", "gs://b/runs/synthetic-1")
    assert (
        TrackingSidecar.start(worker_1, storage, Lines()) is None and not (staging / rundir.TRACKING).exists()
    )
    chief = WorkerContext("synthetic-1", staging, 0, 2, "127.0.0.1:1", "gs://b/runs/synthetic-1")
    output = Lines()
    sidecar = TrackingSidecar.start(chief, storage, output)
    assert sidecar is not None
    sidecar.stop("finished", output, wait=180)
    assert sidecar.process.returncode == 0 and any(
        "[tracking] done (finished)" in line for line in output.lines
    ), output.lines
    again = json.loads((staging / rundir.TRACKING).read_text())
    assert (
        again["wandb"]["id"] == first["wandb"]["id"]
        and again["mlflow"]["run_id"] == first["mlflow"]["run_id"]
    )
    assert again["mlflow"]["rows"] == first["mlflow"]["rows"]  # every row was sent by the first attempt
