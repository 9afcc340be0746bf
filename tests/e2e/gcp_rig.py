"""A user whose cloud is the three stand-ins (the fake TPU API, the sshd pod, the GCS emulator): the cluster
file and environment, and what the rig tests read back from the bucket and the workers. Shared by the GCP rig
tests."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.rigs.fake_compute import FakeComputeServer
from tests.rigs.fake_tpu import FakeTpuServer
from tests.rigs.gcs_emulator import GcsEmulator
from tests.rigs.sshd_pod import SshdPod
from tpuft.core.paths import venv_cache


def rig_cluster(
    tmp_path: Path,
    tpu: FakeTpuServer | FakeComputeServer,
    pod: SshdPod,
    gcs: GcsEmulator,
    worker_env: dict[str, str] | None = None,
    accelerator: str | None = None,
) -> tuple[Path, dict[str, str]]:
    """The cluster file and the environment of a user whose cloud is the three stand-ins. ``tpu``: the fake
    Cloud TPU API, or the fake Compute Engine API (``gcp.api: compute``, a TPU7x slice: default
    ``tpu7x-16``, a MIG of two hosts). ``worker_env``: the workers' environment (default: the emulator's,
    ``STORAGE_EMULATOR_HOST``)."""
    tpu.worker_addresses = pod.addresses
    tpu.host_keys.update(pod.host_keys)  # what the VMs' guest agents publish: tpuft pins them
    if isinstance(tpu, FakeComputeServer):
        api = f"  api: compute\n  zone: us-central1-c\n  compute_api_endpoint: {tpu.endpoint}\n"
        accelerator = accelerator or "tpu7x-16"
    else:
        api = f"  zone: us-central2-b\n  tpu_api_endpoint: {tpu.endpoint}\n"
        accelerator = accelerator or "v4-16"
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(
        f"name: e2e-gcp\nprovider: gcp\naccelerator: {accelerator}\nbucket: gs://e2e-bucket\n"
        f"worker_env: {json.dumps(gcs.env() if worker_env is None else worker_env)}\n"
        f"gcp:\n  project: tpuft-test\n{api}"
        f"  worker_device: cpu\n  venv_cache: {venv_cache()}\n"
        f"ssh:\n  user: {pod.user}\n  key_file: {pod.client_key}\n  port: {pod.port}\n"
    )
    env = {
        **os.environ,
        **gcs.env(),
        "TPUFT_HOME": str(tmp_path / "home"),
        "TPUFT_GCP_POLL_SECONDS": "0.02",
        "TPUFT_SYNC_SECONDS": "2",
        "COLUMNS": "200",
    }
    return cluster, env


def few_test_numbers(folder: Path, count: int) -> Path:
    """The quickstart's first ``count`` test numbers as a file of their own: a rig's run tests once, and what
    matters is that it does, not the score."""
    few = folder / "test.jsonl"
    lines = (Path(__file__).parents[2] / "tpuft/recipes/data/numbers/test.jsonl").read_text().splitlines(True)
    few.write_text("".join(lines[:count]))
    return few


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


def predict_in_the_bucket(
    gcs: GcsEmulator,
    tpuft: Callable[..., subprocess.CompletedProcess[str]],
    run_url: str,
    name: str,
    lines: int = 100,
    shard_lines: int = 40,
) -> dict[str, Any]:
    """``tpuft predict RUN`` with its input and OUT in the bucket, on the quickstart's first ``lines`` test
    numbers: the input sharded over the two SSH workers, which restore the run's last checkpoint from the
    bucket and write their parts of every shard there; OUT is every input once, in input order, its
    predictions those of the run's test evaluation (the same weights, in memory at the last step), and the
    scores those its rows give. ``tpuft(*args)`` runs the CLI on the rig's cluster. Returns the result's
    JSON."""
    from tpuft.core.paths import recipes_dir
    from tpuft.scoring.predictions import score, shard_name

    bucket = gcs.client().bucket("e2e-bucket")
    records = (recipes_dir() / "data/numbers/test.jsonl").read_text().splitlines()[:lines]
    bucket.blob(f"inputs/{name}.jsonl").upload_from_string("\n".join(records) + "\n")
    output = f"outputs/{name}.jsonl"
    started = time.monotonic()
    done = tpuft(
        "predict",
        run_url.rsplit("/", 1)[-1],
        "--input",
        f"gs://e2e-bucket/inputs/{name}.jsonl",
        "--output",
        f"gs://e2e-bucket/{output}",
        "--shard-lines",
        str(shard_lines),
        "--json",
    )
    assert done.returncode == 0, done.stderr[-6000:]
    result = json.loads(done.stdout)
    assert result["rows"] == lines and result["shards"] == f"gs://e2e-bucket/{output}.shards", result
    parts = {b.name for b in gcs.client().list_blobs("e2e-bucket", prefix=f"{output}.shards/")}
    shards = -(-lines // shard_lines)
    assert {
        f"{output}.shards/shard-{k:06d}/{shard_name(p)}" for k in range(shards) for p in (0, 1)
    } <= parts, parts
    rows = [json.loads(line) for line in bucket.blob(output).download_as_text().splitlines()]
    assert [r["id"] for r in rows] == list(range(lines))
    assert [r["target"] for r in rows] == [json.loads(record)["digits"] for record in records]
    run = run_url.removeprefix("gs://e2e-bucket/")
    tested = sorted(
        (
            json.loads(line)
            for p in (0, 1)
            for line in bucket.blob(f"{run}/test/{shard_name(p)}").download_as_text().splitlines()
        ),
        key=lambda r: r["id"],
    )
    assert [r["prediction"] for r in rows] == [r["prediction"] for r in tested[:lines]]
    assert result["scores"] == pytest.approx(
        score([r["prediction"] for r in rows], [r["target"] for r in rows])
    )
    assert sum(r["correct"] for r in rows) == round(result["scores"]["exact_match"] * lines)
    print(
        f"\npredict {name} on the GCP rigs: {lines} rows over 2 SSH workers "
        f"in {time.monotonic() - started:.0f} s end to end, exact match {result['scores']['exact_match']}"
    )
    return result
