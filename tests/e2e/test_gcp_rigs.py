"""`tpuft up quickstart` with provider: gcp, end to end against the stand-ins: the fake TPU API hands out the sshd
pod's addresses as the node's workers, the run dir lives in the emulated bucket. Workers run the real PyTorch/XLA
trainer on CPU (gcp.worker_device: cpu) and share this machine's venv cache (they are loopback hosts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.rigs.fake_tpu import FakeTpuServer
from tests.rigs.gcs_emulator import GcsEmulator
from tests.rigs.sshd_pod import SshdPod, sshd_available
from tpuft.paths import venv_cache

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sshd_available(), reason="needs openssh-server")]


def test_up_on_gcp_rigs(tmp_path: Path) -> None:
    with FakeTpuServer(operation_polls=1) as tpu, SshdPod(tmp_path / "pod", workers=2) as pod, GcsEmulator() as gcs:
        tpu.worker_addresses = pod.addresses
        cluster = tmp_path / "tpuft.yaml"
        cluster.write_text(
            f"name: e2e-gcp\nprovider: gcp\naccelerator: v4-16\nbucket: gs://e2e-bucket\n"
            f"worker_env: {{STORAGE_EMULATOR_HOST: '{gcs.endpoint}'}}\n"
            f"gcp:\n  project: tpuft-test\n  zone: us-central2-b\n  tpu_api_endpoint: {tpu.endpoint}\n"
            f"  worker_device: cpu\n  venv_cache: {venv_cache()}\n"
            f"ssh:\n  user: {pod.user}\n  key_file: {pod.client_key}\n  port: {pod.port}\n"
        )
        env = {
            **os.environ, **gcs.env(), "TPUFT_HOME": str(tmp_path / "home"), "TPUFT_GCP_POLL_SECONDS": "0.02",
            "TPUFT_SYNC_SECONDS": "2", "COLUMNS": "200",
        }
        args = ["--set", "train.steps=40", "--set", "train.warmup_steps=5", "--set", "train.log_every=10",
                "--set", "eval.every=20", "--set", "eval.max_examples=64"]
        up = subprocess.run([sys.executable, "-m", "tpuft", "up", "quickstart", "-c", str(cluster), "--yes", "--json", *args],
                            env=env, capture_output=True, text=True, timeout=1800)
        assert up.returncode == 0, up.stderr[-6000:]
        summary = json.loads(up.stdout)
        run_url = summary["run_dir"]
        assert run_url.startswith("gs://e2e-bucket/runs/quickstart-")
        assert summary["export_dir"] == f"{run_url}/export/hf"
        assert summary["last_eval"]["eval_examples"] == 64
        digests = summary["weight_digests"]
        assert len(digests) == 2 and len(set(digests.values())) == 1  # data-parallel over SSH: identical weights

        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        os.environ.update(gcs.env())
        client = storage.Client(project="proj", credentials=AnonymousCredentials())
        prefix = run_url.removeprefix("gs://e2e-bucket/") + "/"
        names = {b.name.removeprefix(prefix) for b in client.list_blobs("e2e-bucket", prefix=prefix)}
        for expected in ("recipe.yaml", "run.json", "metrics.jsonl", "heartbeat/worker-0.json", "heartbeat/worker-1.json",
                         "logs/worker-0.log", "logs/worker-1.log", "checkpoints/step_00000040/model.safetensors",
                         "export/hf/config.json", "export/hf/model.safetensors"):
            assert expected in names, sorted(names)
        assert any(n.startswith("tb/events.out.tfevents") for n in names)
        assert json.loads(client.bucket("e2e-bucket").blob(prefix + "run.json").download_as_text())["status"] == "finished"

        shown = subprocess.run([sys.executable, "-m", "tpuft", "monitor", "-c", str(cluster), "--json"], env=env, capture_output=True, text=True)
        assert shown.returncode == 0, shown.stderr
        snap = json.loads(shown.stdout)
        assert snap["run_dir"] == run_url and snap["status"] == "finished" and snap["step"] == 40
        assert [w["status"] for w in snap["workers"]] == ["finished", "finished"]
        logs = subprocess.run([sys.executable, "-m", "tpuft", "logs", "-c", str(cluster)], env=env, capture_output=True, text=True)
        assert logs.returncode == 0, logs.stderr
        assert any(line.startswith("[w1] ") for line in logs.stdout.splitlines()) and "step 40/40" in logs.stdout

        pulled_dir = tmp_path / "pulled"
        pulled = subprocess.run([sys.executable, "-m", "tpuft", "pull", "latest", str(pulled_dir), "-c", str(cluster), "--json"],
                                env=env, capture_output=True, text=True, timeout=300)
        assert pulled.returncode == 0, pulled.stderr
        assert json.loads(pulled.stdout)["checkpoints"] == [40] and json.loads(pulled.stdout)["files_skipped"] == 0
        for expected in ("run.json", "metrics.jsonl", "logs/worker-1.log", "checkpoints/step_00000040/model.safetensors", "export/hf/config.json"):
            assert (pulled_dir / expected).is_file(), expected
        again = subprocess.run([sys.executable, "-m", "tpuft", "pull", "latest", str(pulled_dir), "-c", str(cluster), "--json"],
                               env=env, capture_output=True, text=True, timeout=300)
        assert json.loads(again.stdout)["files_fetched"] == 0  # everything already there and verified

        converted = subprocess.run([sys.executable, "-m", "tpuft", "convert", "--run", run_url.rsplit("/", 1)[-1], str(tmp_path / "hf"),
                                    "-c", str(cluster), "--dtype", "bfloat16", "--json"], env=env, capture_output=True, text=True, timeout=300)
        assert converted.returncode == 0, converted.stderr
        assert json.loads(converted.stdout)["step"] == 40 and (tmp_path / "hf" / "model.safetensors").is_file()

        deleted = subprocess.run([sys.executable, "-m", "tpuft", "delete", "-c", str(cluster), "--yes"], env=env, capture_output=True, text=True)
        assert deleted.returncode == 0 and tpu.node("e2e-gcp") is None
