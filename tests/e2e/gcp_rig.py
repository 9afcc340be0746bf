"""A user whose cloud is the three stand-ins (the fake TPU API, the sshd pod, the GCS emulator): the cluster file and
environment, and what the rig tests read back from the bucket and the workers. Shared by the GCP rig tests."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.rigs.fake_tpu import FakeTpuServer
from tests.rigs.gcs_emulator import GcsEmulator
from tests.rigs.sshd_pod import SshdPod
from tpuft.paths import venv_cache


def rig_cluster(tmp_path: Path, tpu: FakeTpuServer, pod: SshdPod, gcs: GcsEmulator,
                worker_env: dict[str, str] | None = None) -> tuple[Path, dict[str, str]]:
    """The cluster file and the environment of a user whose cloud is the three stand-ins. ``worker_env``: the
    workers' environment (default: the emulator's, ``STORAGE_EMULATOR_HOST``)."""
    tpu.worker_addresses = pod.addresses
    tpu.host_keys.update(pod.host_keys)  # what the VMs' guest agents publish: tpuft pins them
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(
        f"name: e2e-gcp\nprovider: gcp\naccelerator: v4-16\nbucket: gs://e2e-bucket\n"
        f"worker_env: {json.dumps(gcs.env() if worker_env is None else worker_env)}\n"
        f"gcp:\n  project: tpuft-test\n  zone: us-central2-b\n  tpu_api_endpoint: {tpu.endpoint}\n"
        f"  worker_device: cpu\n  venv_cache: {venv_cache()}\n"
        f"ssh:\n  user: {pod.user}\n  key_file: {pod.client_key}\n  port: {pod.port}\n"
    )
    env = {
        **os.environ, **gcs.env(), "TPUFT_HOME": str(tmp_path / "home"), "TPUFT_GCP_POLL_SECONDS": "0.02",
        "TPUFT_SYNC_SECONDS": "2", "COLUMNS": "200",
    }
    return cluster, env


def bucket_json(gcs: GcsEmulator, name: str) -> dict | None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    os.environ.update(gcs.env())
    blob = storage.Client(project="proj", credentials=AnonymousCredentials()).bucket("e2e-bucket").blob(name)
    return json.loads(blob.download_as_text()) if blob.exists() else None


def staged_step(pod: SshdPod, worker: int) -> int:
    """The trainer's last step, from its heartbeat in the worker's staging folder."""
    beats = list((pod.home(worker) / ".tpuft" / "runs").glob(f"*/heartbeat/worker-{worker}.json"))
    try:
        return max(int(json.loads(b.read_text()).get("step") or 0) for b in beats) if beats else 0
    except (ValueError, json.JSONDecodeError):
        return 0
