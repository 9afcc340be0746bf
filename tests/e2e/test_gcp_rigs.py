"""`tpuft up quickstart` with provider: gcp, end to end against the stand-ins: the fake TPU API hands out the
sshd pod's addresses as the node's workers, the run dir lives in the emulated bucket. Workers run the real
PyTorch/XLA trainer on CPU (gcp.worker_device: cpu) and share this machine's venv cache (they are loopback
hosts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.e2e.gcp_rig import bucket_json, rig_cluster, staged_step
from tests.rigs.fake_tpu import FakeTpuServer
from tests.rigs.gcs_emulator import GcsEmulator
from tests.rigs.sshd_pod import SshdPod, sshd_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.backend_venvs("torch_xla"),
    pytest.mark.skipif(not sshd_available(), reason="needs openssh-server"),
]


def test_up_on_gcp_rigs(tmp_path: Path) -> None:
    with (
        FakeTpuServer(operation_polls=1) as tpu,
        SshdPod(tmp_path / "pod", workers=2) as pod,
        GcsEmulator() as gcs,
    ):
        cluster, env = rig_cluster(tmp_path, tpu, pod, gcs)
        # 32 test numbers, tested on the SSH workers; the score is not the point
        few = tmp_path / "test.jsonl"
        few.write_text(
            "".join(
                (Path(__file__).parents[2] / "tpuft/recipes/data/numbers/test.jsonl")
                .read_text()
                .splitlines(True)[:32]
            )
        )
        args = [
            "--set",
            "train.steps=40",
            "--set",
            "train.warmup_steps=5",
            "--set",
            "train.log_every=10",
            "--set",
            "eval.every=20",
            "--set",
            "eval.max_examples=64",
            "--set",
            f"data.test={few}",
        ]
        up = subprocess.run(
            [sys.executable, "-m", "tpuft", "up", "quickstart", "-c", str(cluster), "--yes", "--json", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert up.returncode == 0, up.stderr[-6000:]
        summary = json.loads(up.stdout)
        run_url = summary["run_dir"]
        assert run_url.startswith("gs://e2e-bucket/runs/quickstart-")
        assert summary["export_dir"] == f"{run_url}/export/hf"
        assert summary["last_eval"]["eval_examples"] == 64
        assert summary["test"]["test_examples"] == 32 and summary["test"]["test_checkpoint_step"] == 40, (
            summary["test"]
        )
        digests = summary["weight_digests"]
        # data-parallel over SSH: identical weights
        assert len(digests) == 2 and len(set(digests.values())) == 1

        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        os.environ.update(gcs.env())
        client = storage.Client(project="proj", credentials=AnonymousCredentials())
        prefix = run_url.removeprefix("gs://e2e-bucket/") + "/"
        names = {b.name.removeprefix(prefix) for b in client.list_blobs("e2e-bucket", prefix=prefix)}
        for expected in (
            "recipe.yaml",
            "run.json",
            "metrics.jsonl",
            "heartbeat/worker-0.json",
            "heartbeat/worker-1.json",
            "logs/worker-0.log",
            "logs/worker-1.log",
            "checkpoints/step_00000040/model.safetensors",
            "export/hf/config.json",
            "export/hf/model.safetensors",
            "test/predictions-00000.jsonl",
            "test/predictions-00001.jsonl",
        ):
            assert expected in names, sorted(names)
        assert any(n.startswith("tb/events.out.tfevents") for n in names)
        assert (
            json.loads(client.bucket("e2e-bucket").blob(prefix + "run.json").download_as_text())["status"]
            == "finished"
        )

        shown = subprocess.run(
            [sys.executable, "-m", "tpuft", "monitor", "-c", str(cluster), "--json"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert shown.returncode == 0, shown.stderr
        snap = json.loads(shown.stdout)
        assert snap["run_dir"] == run_url and snap["status"] == "finished" and snap["step"] == 40
        assert [w["status"] for w in snap["workers"]] == ["finished", "finished"]
        logs = subprocess.run(
            [sys.executable, "-m", "tpuft", "logs", "-c", str(cluster)],
            env=env,
            capture_output=True,
            text=True,
        )
        assert logs.returncode == 0, logs.stderr
        assert (
            any(line.startswith("[w1] ") for line in logs.stdout.splitlines()) and "step 40/40" in logs.stdout
        )

        pulled_dir = tmp_path / "pulled"
        pulled = subprocess.run(
            [sys.executable, "-m", "tpuft", "pull", "latest", str(pulled_dir), "-c", str(cluster), "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert pulled.returncode == 0, pulled.stderr
        assert (
            json.loads(pulled.stdout)["checkpoints"] == [40]
            and json.loads(pulled.stdout)["files_skipped"] == 0
        )
        for expected in (
            "run.json",
            "metrics.jsonl",
            "logs/worker-1.log",
            "checkpoints/step_00000040/model.safetensors",
            "export/hf/config.json",
        ):
            assert (pulled_dir / expected).is_file(), expected
        again = subprocess.run(
            [sys.executable, "-m", "tpuft", "pull", "latest", str(pulled_dir), "-c", str(cluster), "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert json.loads(again.stdout)["files_fetched"] == 0  # everything already there and verified

        converted = subprocess.run(
            [
                sys.executable,
                "-m",
                "tpuft",
                "convert",
                "--run",
                run_url.rsplit("/", 1)[-1],
                str(tmp_path / "hf"),
                "-c",
                str(cluster),
                "--dtype",
                "bfloat16",
                "--json",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert converted.returncode == 0, converted.stderr
        assert (
            json.loads(converted.stdout)["step"] == 40 and (tmp_path / "hf" / "model.safetensors").is_file()
        )

        _predict_in_the_bucket(client, cluster, env, run_url.rsplit("/", 1)[-1])

        deleted = subprocess.run(
            [sys.executable, "-m", "tpuft", "delete", "-c", str(cluster), "--yes"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert deleted.returncode == 0 and tpu.node("e2e-gcp") is None


def _predict_in_the_bucket(client: object, cluster: Path, env: dict[str, str], run_id: str) -> None:
    """``tpuft predict`` of the run with its input and output in the bucket: the input sharded over the SSH
    workers, which read the checkpoint and write their parts in the bucket; the controller joins OUT there, in
    input order."""
    from tpuft.core.paths import recipes_dir

    bucket = client.bucket("e2e-bucket")  # type: ignore[attr-defined]
    lines = (recipes_dir() / "data/numbers/test.jsonl").read_text().splitlines()[:120]
    bucket.blob("inputs/numbers.jsonl").upload_from_string("\n".join(lines) + "\n")
    predicted = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpuft",
            "predict",
            run_id,
            "--input",
            "gs://e2e-bucket/inputs/numbers.jsonl",
            "--output",
            "gs://e2e-bucket/outputs/numbers.jsonl",
            "--shard-lines",
            "50",
            "-c",
            str(cluster),
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert predicted.returncode == 0, predicted.stderr[-6000:]
    result = json.loads(predicted.stdout)
    assert result["rows"] == 120 and result["scores"]["examples"] == 120
    assert result["shards"] == "gs://e2e-bucket/outputs/numbers.jsonl.shards"
    parts = {b.name for b in client.list_blobs("e2e-bucket", prefix="outputs/numbers.jsonl.shards/")}  # type: ignore[attr-defined]
    assert {
        f"outputs/numbers.jsonl.shards/shard-00000{k}/predictions-0000{p}.jsonl"
        for k in range(3)
        for p in range(2)
    } <= parts
    rows = [json.loads(line) for line in bucket.blob("outputs/numbers.jsonl").download_as_text().splitlines()]
    assert [r["id"] for r in rows] == list(range(120))
    assert [r["input"] for r in rows] == [json.loads(line)["words"] for line in lines]
    assert sum(r["correct"] for r in rows) == round(result["scores"]["exact_match"] * 120)
    print(f"\npredict on the GCP rigs: 120 rows over 2 SSH workers in {result['seconds']} s")

    # this machine's files
    local_in, local_out = (
        cluster.parent / "numbers.jsonl",
        cluster.parent / "predicted.jsonl",
    )
    local_in.write_text("\n".join(lines[:60]) + "\n")
    here = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpuft",
            "predict",
            run_id,
            "--input",
            str(local_in),
            "--output",
            str(local_out),
            "--shard-lines",
            "50",
            "-c",
            str(cluster),
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert here.returncode == 0, here.stderr[-6000:]
    shipped = json.loads(here.stdout)
    # the workers' parts
    assert shipped["shards"].startswith("gs://e2e-bucket/predict/") and shipped["rows"] == 60
    # same model, same rows
    assert [json.loads(line) for line in local_out.read_text().splitlines()] == rows[:60]


def test_a_run_outlives_its_connections_and_its_controller_on_gcp_rigs(tmp_path: Path) -> None:
    """Leftovers of a dead run are cleaned; dropped SSH sessions and a kill -9 of the controller leave the run
    to finish and export; ``stop`` leaves no trainer on any worker."""
    import signal
    import time

    with (
        FakeTpuServer(operation_polls=1) as tpu,
        SshdPod(tmp_path / "pod", workers=2) as pod,
        GcsEmulator() as gcs,
    ):
        cluster, env = rig_cluster(tmp_path, tpu, pod, gcs)
        for verb in (["create", "--yes"], ["setup", "quickstart"]):
            done = subprocess.run(
                [sys.executable, "-m", "tpuft", *verb, "-c", str(cluster)],
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert done.returncode == 0, done.stderr[-4000:]
        pod.home(1).mkdir(parents=True, exist_ok=True)
        leftover = subprocess.Popen(
            ["sleep", "300"],
            env={**os.environ, "HOME": str(pod.home(1)), "TPUFT_RUN_ID": "old-run"},
            start_new_session=True,
        )
        total = 120  # the run goes on for ~70 steps after the controller is killed (guarded below)
        # the test evaluation is the up test's
        args = [
            "--set",
            f"train.steps={total}",
            "--set",
            "train.warmup_steps=5",
            "--set",
            "train.log_every=5",
            "--set",
            "eval.every=60",
            "--set",
            "eval.max_examples=32",
            "--set",
            "train.checkpoint_every=50",
            "--set",
            "data.test=null",
        ]
        log = (tmp_path / "train.out").open("w")
        controller = subprocess.Popen(
            [sys.executable, "-m", "tpuft", "train", "quickstart", "-c", str(cluster), *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert leftover.wait(timeout=120) == -signal.SIGKILL  # cleaned before the run started
        wait_until(lambda: staged_step(pod, 0) >= 5, 180, "step 5")
        assert pod.drop_sessions() >= 2  # every SSH connection of the controller, gone at once
        out = tmp_path / "train.out"
        wait_until(
            lambda: f"step 50/{total}" in out.read_text(),
            180,
            "the controller to re-attach and stream step 50",
        )
        controller.kill()
        controller.wait(timeout=10)
        assert staged_step(pod, 0) < total, (
            "the run ended before its controller was killed: give it more steps"
        )
        text = out.read_text()
        assert "cleaned worker 1: killed pid" in text
        for step in range(5, 51, 5):  # re-attached from the next line: nothing lost, nothing twice
            assert text.count(f"step {step}/{total} ") == 1, (step, text[-3000:])
        run_id = next((pod.home(0) / ".tpuft" / "runs").iterdir()).name
        prefix = f"runs/{run_id}"
        info = wait_until(
            lambda: (i := bucket_json(gcs, f"{prefix}/run.json")) and i["status"] != "running" and i,
            300,
            "the run to end",
        )
        assert info["status"] == "finished", info
        assert bucket_json(gcs, f"{prefix}/export/hf/config.json") is not None
        shown = subprocess.run(
            [sys.executable, "-m", "tpuft", "runs", "-c", str(cluster), "--json"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert json.loads(shown.stdout)[-1]["status"] == "finished"

        started = subprocess.run(
            [
                sys.executable,
                "-m",
                "tpuft",
                "train",
                "quickstart",
                "-c",
                str(cluster),
                "--detach",
                "--json",
                "--set",
                "train.steps=5000",
                "--set",
                "train.checkpoint_every=1000",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert started.returncode == 0, started.stderr[-4000:]
        second = json.loads(started.stdout)["run_id"]
        wait_until(
            lambda: staged_step(pod, 0) >= 3 and staged_step(pod, 1) >= 3, 180, "the second run to train"
        )
        t0 = time.monotonic()
        stopped = subprocess.run(
            [sys.executable, "-m", "tpuft", "stop", second, "-c", str(cluster), "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert stopped.returncode == 0, stopped.stderr[-4000:]
        result = json.loads(stopped.stdout)
        assert result["status"] == "stopped" and time.monotonic() - t0 < 60
        from tpuft.worker.supervisor.process import is_alive

        assert not any(is_alive(pid) for pid in result["trainer_pids"].values())
