"""Long runs on the local CPU pod with the real PyTorch/XLA trainer: a run outlives a kill -9 of its
controller, and a run killed after a checkpoint and resumed ends with exactly the weights of the uninterrupted
run (same weight digest), its metrics continuing without duplicates. Those two runs are Multislice rehearsals,
2 slices x 1 worker: the worker killed is slice 1's, the run fails naming it, and the resume brings both
slices back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tpuft.backends.torch_xla import LAYOUT
from tpuft.run import rundir
from tpuft.worker.supervisor.process import is_alive

pytestmark = [pytest.mark.slow, pytest.mark.backend_venvs("torch_xla")]

SETTINGS = [
    "--set",
    "train.steps=48",
    "--set",
    "train.warmup_steps=4",
    "--set",
    "train.log_every=4",
    "--set",
    "train.checkpoint_every=16",
    "--set",
    "eval.every=24",
    "--set",
    "eval.max_examples=32",
    "--set",
    "model.config.dropout_rate=0.1",  # dropout draws random numbers: the RNG state must resume too
]


def info(run: Path) -> dict[str, Any]:
    return rundir.read_json(run / rundir.RUN_INFO) or {}


def step_of(run: Path, worker: int) -> int:
    return int((rundir.read_json(rundir.heartbeat_path(run, worker)) or {}).get("step") or 0)


def digests(run: Path) -> set[str]:
    return {
        str((rundir.read_json(rundir.heartbeat_path(run, w)) or {}).get("params_sha256")) for w in range(2)
    }


def test_killed_controller_and_resumed_crash_end_with_the_uninterrupted_weights(tmp_path: Path) -> None:
    env = {**os.environ, "TPUFT_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    # 2 slices of 1 worker: the replicas, data shards and digests of 1 x 2 workers
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(
        "name: long\nprovider: local\naccelerator: v4-16\nlocal:\n  workers: 1\n  slices: 2\n"
        "  devices_per_worker: 1\n"
    )
    runs = tmp_path / "home" / "buckets" / "long" / "runs"
    # a test set of 40 numbers: the point is how often it is tested, not the score
    few = tmp_path / "test.jsonl"
    few.write_text(
        "".join(
            (Path(__file__).parents[2] / "tpuft/recipes/data/numbers/test.jsonl")
            .read_text()
            .splitlines(True)[:40]
        )
    )
    settings = [*SETTINGS, "--set", f"data.test={few}"]

    def tpuft(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tpuft", *args, "-c", str(cluster)],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    # 1. The controller is killed mid-run: the run trains on, stops with a checkpoint when asked, and once
    # resumed finishes and exports by itself.
    controller = subprocess.Popen(
        [sys.executable, "-m", "tpuft", "up", "quickstart", "-c", str(cluster), *settings],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = wait_until(
        lambda: next(iter(runs.iterdir()), None) if runs.is_dir() else None, 600, "the first run dir"
    )
    wait_until(lambda: step_of(first, 0) >= 6, 600, "step 6")
    controller.send_signal(signal.SIGKILL)
    controller.wait(timeout=10)
    # 1b. tpuft stop --checkpoint (past the periodic checkpoint at 16: an asked-for one): both hosts save at
    # one step boundary and stop right after it; the resume starts at exactly that step (no step lost, none
    # re-run).
    wait_until(lambda: step_of(first, 0) >= 17, 600, "step 17")
    asked = time.monotonic()
    stopped = tpuft("stop", first.name, "--checkpoint", "--json", timeout=300)
    assert stopped.returncode == 0, stopped.stderr[-4000:]
    stop_seconds = time.monotonic() - asked
    at = json.loads(stopped.stdout)["checkpoint"]["step"]
    assert (
        json.loads(stopped.stdout)["status"] == "stopped"
        and info(first)["cause"] == "stopped with tpuft stop --checkpoint"
    )
    assert at in dict(LAYOUT.local_checkpoints(first / LAYOUT.checkpoints)) and at < 48
    assert {step_of(first, w) for w in range(2)} == {at}  # no host trained past the checkpoint
    relaunched = time.monotonic()
    resumed_first = tpuft("resume", first.name, "--json")
    assert resumed_first.returncode == 0, resumed_first.stderr[-4000:]
    first_log = (first / "logs" / "worker-0.log").read_text()
    assert (
        f"resuming from checkpoint step_{at:08d}" in first_log
        and f"training steps {at + 1} to 48" in first_log
    )
    print(
        f"\nstop --checkpoint: step {at} complete {json.loads(stopped.stdout)['checkpoint']['latency_s']} "
        f"s after the ask, stopped {stop_seconds:.1f} s after it; the resume to step 48 "
        f"took {time.monotonic() - relaunched:.0f} s"
    )
    assert info(first)["status"] == "finished", info(first)
    assert (first / rundir.EXPORT_HF / "config.json").is_file()
    uninterrupted = digests(first)
    assert len(uninterrupted) == 1 and "None" not in uninterrupted  # both replicas, identical weights
    assert (
        info(first)["slices"] == 2
        and "mesh: slices 2 x hosts 1 x devices 1 (data)" in (first / "logs" / "worker-0.log").read_text()
    )

    # 2. Slice 1's trainer is killed after the checkpoint at step 32: the run fails naming it; resumed (both
    # slices), it ends identical.
    started = tpuft("train", "quickstart", "--detach", "--json", *settings)
    assert started.returncode == 0, started.stderr[-4000:]
    second = runs / json.loads(started.stdout)["run_id"]
    # tpuft checkpoint at the step the first run stopped at: the same reseed there (a torch checkpoint reseeds
    # every replica where a resume from it would), so the weights can end identical.
    asked_second = tpuft("checkpoint", second.name, "--at-step", str(at), "--json", timeout=300)
    assert asked_second.returncode == 0, asked_second.stderr[-4000:]
    ondemand = json.loads(asked_second.stdout)
    assert ondemand["step"] == at and ondemand["path"].endswith(f"step_{at:08d}")
    print(f"tpuft checkpoint --at-step {at}: complete {ondemand['latency_s']} s after the ask")
    wait_until(
        lambda: (
            32 in dict(LAYOUT.local_checkpoints(second / LAYOUT.checkpoints)) and step_of(second, 1) >= 34
        ),
        600,
        "the checkpoint at step 32 and step 34",
    )
    restart = max(32, at)  # the latest checkpoint before the kill (the asked-for one is complete by now)
    record = json.loads((second / "attempts" / "1" / "worker-1.json").read_text())
    os.kill(record["trainer_pid"], signal.SIGKILL)
    reached = step_of(second, 0)
    wait_until(lambda: info(second).get("status") not in (None, "running"), 60, "the second run to fail")
    failed = info(second)
    assert failed["status"] == "failed" and failed["culprit"] == 1, failed
    assert (
        failed["cause"].startswith("slice 1 host 0 (worker 1): ") and "killed by signal 9" in failed["cause"]
    ), failed

    resumed = tpuft("resume", second.name, "--json")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert json.loads(resumed.stdout)["attempt"] == 2
    assert digests(second) == uninterrupted  # exact resume: weights, optimizer, schedule, data order, RNG
    steps = [r["step"] for r in rundir.read_metrics(second).train_rows]
    assert steps == sorted(set(steps)) and steps[-1] == 48  # re-run steps replaced their rows, none twice
    assert f"resuming from checkpoint step_{restart:08d}" in (second / "logs" / "worker-0.log").read_text()
    assert {step_of(second, w) for w in range(2)} == {48}  # both slices resumed to the end
    # The killed attempt never reached its test; the resumed one tested once, as the uninterrupted run did.
    for run in (first, second):
        tests = [r for r in rundir.read_metrics(run).rows if "test_examples" in r]
        assert len(tests) == 1 and tests[0]["test_examples"] == 40 and tests[0]["step"] == 48, tests
    assert (
        rundir.read_metrics(second).test_row["test_exact_match"]
        == rundir.read_metrics(first).test_row["test_exact_match"]
    )
    print(
        f"\nkilled at step {reached}, resumed from the checkpoint at {restart}: {reached - restart} step(s) "
        "re-run, 0 lost"
    )


def test_a_sigstopped_worker_is_named_hung_and_the_run_stopped(tmp_path: Path) -> None:
    """The real trainer's heartbeats against its supervisor: worker 1 frozen mid-run (SIGSTOP) is named, not
    worker 0 that waits for it in gloo's all-reduce; both trainers end, well before gloo's own 30-minute
    timeout."""
    env = {**os.environ, "TPUFT_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(
        "name: hang\nprovider: local\naccelerator: v4-16\nlocal:\n  workers: 2\n  devices_per_worker: 1\n"
    )
    started = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpuft",
            "up",
            "quickstart",
            "-c",
            str(cluster),
            "--detach",
            "--json",
            "--set",
            "train.steps=5000",
            "--set",
            "train.hang_timeout=5s",
            "--set",
            "eval.every=100000",
            "--set",
            "train.log_every=10",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert started.returncode == 0, started.stderr[-4000:]
    run = tmp_path / "home" / "buckets" / "hang" / "runs" / json.loads(started.stdout)["run_id"]
    wait_until(lambda: step_of(run, 1) >= 20, 600, "step 20")
    trainers = {
        w: json.loads((run / "attempts" / "1" / f"worker-{w}.json").read_text())["trainer_pid"]
        for w in range(2)
    }
    os.kill(trainers[1], signal.SIGSTOP)
    wait_until(lambda: info(run).get("status") not in (None, "running"), 90, "the run to be stopped")
    final = info(run)
    assert final["status"] == "failed" and final["culprit"] == 1, final
    assert final["cause"].startswith("hung: worker 1 was stopped (SIGSTOP) for "), final["cause"]
    records = {w: json.loads((run / "attempts" / "1" / f"worker-{w}.json").read_text()) for w in range(2)}
    assert records[0]["status"] == "stopped" and records[1]["status"] == "hung"
    for pid in trainers.values():
        wait_until(lambda pid=pid: not is_alive(pid), 15, f"trainer {pid} to be gone")
