"""The Keras backend with provider: gcp against the stand-ins: the fake Compute Engine API makes a TPU7x slice
(``gcp.api: compute``, ``tpu7x-16``: a managed instance group of two hosts with a workload policy) whose hosts
are the sshd pod's workers (worker_device: cpu, so MultiWorkerMirroredStrategy over the workers' loopback
addresses, TF_CONFIG from TPUFT_PEERS), and the run dir lives in the emulated bucket. The Keras trainer writes
its staging folder and the supervisor mirrors it: checkpoints (HF TF weights + optimizer + manifest), metrics,
the export.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.gcp_rig import predict_in_the_bucket, rig_cluster
from tests.rigs.fake_compute import FakeComputeServer
from tests.rigs.gcs_emulator import GcsEmulator
from tests.rigs.sshd_pod import SshdPod, sshd_available

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sshd_available(), reason="needs openssh-server")]


def test_keras_up_on_gcp_rigs(tmp_path: Path, keras_python: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with (
        FakeComputeServer(operation_polls=1) as compute,
        SshdPod(tmp_path / "pod", workers=2) as pod,
        GcsEmulator() as gcs,
    ):
        cluster, env = rig_cluster(tmp_path, compute, pod, gcs)  # the Cloud TPU API's rig: the others
        settings = [
            "--set",
            "train.steps=100",
            "--set",
            "train.log_every=25",
            "--set",
            "train.checkpoint_every=50",
            "--set",
            "eval.every=50",
            "--set",
            "eval.max_examples=64",
        ]
        up = subprocess.run(
            [
                sys.executable,
                "-m",
                "tpuft",
                "up",
                "keras_quickstart",
                "-c",
                str(cluster),
                "--yes",
                "--json",
                *settings,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert up.returncode == 0, up.stderr[-6000:]
        assert "venv ready (cached)" in up.stderr, up.stderr[-3000:]  # keras_python built it: the same key
        summary = json.loads(up.stdout)
        run_url = summary["run_dir"]
        assert run_url.startswith("gs://e2e-bucket/runs/keras_quickstart-")
        assert summary["export_dir"] == f"{run_url}/export/hf"
        assert summary["last_eval"]["eval_examples"] == 64 and "eval_exact_match" in summary["last_eval"]
        digests = summary["weight_digests"]
        # MWMS over SSH-launched workers: in sync
        assert len(digests) == 2 and len(set(digests.values())) == 1

        for key, value in gcs.env().items():
            monkeypatch.setenv(key, value)
        from tpuft.backends.keras import LAYOUT
        from tpuft.storage import open_storage

        storage = open_storage(run_url)
        # complete by their manifests, in the bucket
        assert set(LAYOUT.checkpoint_steps(storage)) == {
            50,
            100,
        }
        names = set(storage.sizes(""))
        for expected in (
            "checkpoints/step_00000100/tf_model.h5",
            "checkpoints/step_00000100/optimizer.npz",
            "export/hf/model.safetensors",
            "metrics.jsonl",
            "logs/worker-1.log",
            "test/predictions-00000.jsonl",
            "test/predictions-00001.jsonl",
        ):  # each host's test share
            assert expected in names, sorted(names)
        rows = [json.loads(line) for line in storage.read_text("metrics.jsonl").splitlines()]
        assert [r["step"] for r in rows if "loss" in r] == [25, 50, 75, 100]
        assert [r["step"] for r in rows if "eval_exact_match" in r] == [50, 100]
        # summed over the SSH workers
        assert [r["test_examples"] for r in rows if "test_examples" in r] == [500]
        assert summary["test"]["test_examples"] == 500 and summary["test"]["test_checkpoint_step"] == 100
        shown = subprocess.run(
            [sys.executable, "-m", "tpuft", "monitor", "--json", "-c", str(cluster)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert shown.returncode == 0, shown.stderr
        snapshot = json.loads(shown.stdout)
        assert (
            snapshot["status"] == "finished"
            and [w["status"] for w in snapshot["workers"]] == ["finished"] * 2
        )

        def tpuft(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "tpuft", *args, "-c", str(cluster)],
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
            )

        predict_in_the_bucket(gcs, tpuft, run_url, "keras")  # the Keras engine on both workers
