"""The T5X backend with provider: gcp, end to end against the stand-ins: the fake Compute Engine API
(``gcp.api: compute``) makes the slices, whose hosts are the sshd pod's workers, and the run dir lives in the
emulated bucket,
gs://e2e-bucket/runs/<id>.

Unlike PyTorch/XLA, T5X writes ``MODEL_DIR`` (gs://.../checkpoints) itself from the workers: Orbax through
``etils.epath`` (TensorFlow's GCS filesystem) and tensorstore's gcs kvstore; tpuft's T5X trainer lists and
reads the bucket with google-cloud-storage and ``tf.io.gfile`` (manifests, pruning, export). The workers reach
the emulator through the variables of :meth:`tests.rigs.gcs_proxy.GcsProxy.env`, given to them as the
cluster's ``worker_env``; TensorFlow's hard-coded Google hosts go through the rig's TLS-terminating proxy.
``tpuft predict`` of the run restores its ``checkpoint_N`` from the bucket the same way on both hosts.

The cluster is a Multislice of 2 x tpu7x-8 (``gcp.slices: 2``: instances ``e2e-gcp-0`` and ``e2e-gcp-1`` from
one instance template): each slice's one host is an sshd worker, the trainers get the MEGASCALE variables and
build T5X's hybrid mesh, and a host killed in slice 1 fails the run (named ``slice 1 host 0``) that ``resume``
finishes on both slices.

The workers share this machine's venv cache (they are loopback hosts): the T5X venv the ``t5x_python`` fixture
built is the one ``tpuft setup`` finds, through the same key (``backend.t5x_source`` =
``tests.venvs.t5x_source``, shipped to the workers' HOMEs as a remote worker gets it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tests.e2e.gcp_rig import predict_in_the_bucket, rig_cluster
from tests.rigs.fake_compute import FakeComputeServer
from tests.rigs.gcs_emulator import GcsEmulator
from tests.rigs.gcs_proxy import GcsProxy
from tests.rigs.sshd_pod import SshdPod, sshd_available
from tests.venvs import t5x_source_settings

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sshd_available(), reason="needs openssh-server")]

SOURCE = t5x_source_settings()
BUCKET = "e2e-bucket"


@dataclass
class Rigs:
    compute: FakeComputeServer
    pod: SshdPod
    gcs: GcsEmulator
    proxy: GcsProxy
    cluster: Path
    env: dict[str, str]
    logs: Path
    """Every command's stdout and stderr, in full (failures show only their tail)."""

    def tpuft(self, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "tpuft", *args, "-c", str(self.cluster)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        self.logs.mkdir(exist_ok=True)
        name = f"{len(list(self.logs.iterdir())) // 2:02d}-{args[0]}"
        (self.logs / f"{name}.out").write_text(done.stdout)
        (self.logs / f"{name}.err").write_text(done.stderr)
        return done

    def names(self, run_url: str) -> set[str]:
        """Every object of a run dir, relative to it."""
        prefix = _prefix(run_url)
        return {b.name.removeprefix(prefix) for b in self.gcs.client().list_blobs(BUCKET, prefix=prefix)}

    def text(self, run_url: str, name: str) -> str | None:
        blob = self.gcs.client().bucket(BUCKET).blob(_prefix(run_url) + name)
        return blob.download_as_text() if blob.exists() else None

    def json(self, run_url: str, name: str) -> dict[str, Any] | None:
        text = self.text(run_url, name)
        try:
            return json.loads(text) if text else None
        except json.JSONDecodeError:  # being rewritten
            return None

    def rows(self, run_url: str) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.text(run_url, "metrics.jsonl") or "").splitlines()]

    def events(self, run_url: str, attempt: int) -> list[dict[str, Any]]:
        """The chief's goodput events of an attempt (tpuft.worker.events), as the run-dir sync uploaded
        them."""
        return [
            json.loads(line)
            for line in (self.text(run_url, f"events/worker-0-attempt-{attempt}.jsonl") or "").splitlines()
        ]

    def checkpoints(self, run_url: str) -> dict[int, str]:
        """Complete checkpoints by tpuft's own reading of the bucket (manifest present and matching)."""
        from tpuft.backends.t5x import LAYOUT
        from tpuft.storage import open_storage

        return LAYOUT.checkpoint_steps(open_storage(run_url))


def _prefix(run_url: str) -> str:
    return run_url.removeprefix(f"gs://{BUCKET}/").rstrip("/") + "/"


@pytest.fixture(scope="module")
def rigs(tmp_path_factory: pytest.TempPathFactory, t5x_python: str) -> Iterator[Rigs]:
    """The stand-ins, two slices made of the sshd pod, and the T5X venv set up on it (from the cache
    ``t5x_python`` filled). This process reads the bucket through google-cloud-storage, as the controller
    does."""
    root = tmp_path_factory.mktemp("t5x-rigs")
    with ExitStack() as stack, pytest.MonkeyPatch.context() as patch:
        compute = stack.enter_context(FakeComputeServer(operation_polls=1))
        pod = stack.enter_context(SshdPod(root / "pod", workers=2))
        gcs = stack.enter_context(GcsEmulator())
        proxy = stack.enter_context(GcsProxy(gcs))
        # gRPC honours https_proxy as well: JAX's coordinator (worker 0's address) is reached directly
        # Multislice: 2 slices x 1 host (instances e2e-gcp-0 and e2e-gcp-1 of one template), each host's
        # trainer one process of T5X's hybrid mesh (the slices on its `replica` axis)
        cluster, env = rig_cluster(
            root, compute, pod, gcs, worker_env=proxy.env(no_proxy=pod.addresses), accelerator="tpu7x-8"
        )
        cluster.write_text(cluster.read_text().replace("gcp:\n", "gcp:\n  slices: 2\n"))
        for key, value in gcs.env().items():
            patch.setenv(key, value)
        rigs = Rigs(compute, pod, gcs, proxy, cluster, env, root / "cli")
        created = rigs.tpuft("create", "--yes", timeout=300)
        assert created.returncode == 0, created.stderr[-4000:]
        setup = rigs.tpuft("setup", "t5x_quickstart", *SOURCE, timeout=1200)
        assert setup.returncode == 0, setup.stderr[-4000:]
        assert "venv ready (cached)" in setup.stdout + setup.stderr, (setup.stdout + setup.stderr)[-3000:]
        yield rigs


def test_t5x_up_on_gcp_rigs(rigs: Rigs) -> None:
    settings = [
        "--set",
        "train.steps=40",
        "--set",
        "train.warmup_steps=5",
        "--set",
        "train.log_every=10",
        "--set",
        "train.checkpoint_every=20",
        "--set",
        "eval.every=20",
        "--set",
        "eval.max_examples=40",
    ]
    started = time.monotonic()
    up = rigs.tpuft("up", "t5x_quickstart", "--yes", "--json", *SOURCE, *settings)
    seconds = time.monotonic() - started
    assert up.returncode == 0, up.stderr[-6000:]
    assert "venv ready (cached)" in up.stderr, up.stderr[-3000:]
    summary = json.loads(up.stdout)
    run_url = summary["run_dir"]
    print(
        f"\nt5x on the gcp rigs: {seconds:.0f} s for `tpuft up`, exact match "
        f"{summary['last_eval'].get('eval_exact_match')}"
    )
    assert run_url.startswith(f"gs://{BUCKET}/runs/t5x_quickstart-")
    assert summary["export_dir"] == f"{run_url}/export/hf"
    assert summary["last_eval"]["eval_examples"] == 40 and "eval_exact_match" in summary["last_eval"], summary
    assert rigs.json(run_url, "run.json")["status"] == "finished"

    names = rigs.names(run_url)
    for expected in (
        "recipe.yaml",
        "run.json",
        "metrics.jsonl",
        "t5x/run.gin",
        "t5x/tasks.py",
        "t5x/task.json",
        "logs/worker-0.log",
        "logs/worker-1.log",
        "eval/predictions-00000040.jsonl",
        "checkpoints/checkpoint_40/manifest.json",
        "export/hf/config.json",
        "export/hf/model.safetensors",
    ):
        assert expected in names, sorted(names)
    gin = rigs.text(run_url, "t5x/run.gin") or ""
    assert f"MODEL_DIR = '{run_url}/checkpoints'" in gin and "TRAIN_STEPS = 40" in gin
    complete = rigs.checkpoints(run_url)
    # written by Orbax on the workers, manifest by tpuft
    assert 40 in complete and set(complete) <= {20, 40}, complete
    # tensorstore's OCDBT
    assert any(n.startswith("checkpoints/checkpoint_40/") and "ocdbt" in n for n in names)

    rows = rigs.rows(run_url)
    assert [r["step"] for r in rows if "loss" in r] == [10, 20, 30, 40]
    assert [r["step"] for r in rows if "eval_exact_match" in r] == [20, 40]
    predictions = (rigs.text(run_url, "eval/predictions-00000040.jsonl") or "").splitlines()
    assert len(predictions) == 40 and {"input", "prediction", "target"} <= set(json.loads(predictions[0]))
    for worker in (0, 1):
        beat = rigs.json(run_url, f"heartbeat/worker-{worker}.json") or {}
        assert beat.get("status") == "finished" and beat.get("step") == 40, beat
    check_goodput_events(rigs.events(run_url, 1))

    shown = rigs.tpuft("monitor", "--json", timeout=120)
    assert shown.returncode == 0, shown.stderr
    snap = json.loads(shown.stdout)
    assert snap["run_dir"] == run_url and snap["status"] == "finished" and snap["step"] == 40
    assert [w["status"] for w in snap["workers"]] == ["finished", "finished"]
    # both hosts restore checkpoint_40 from gs:// through the proxy and decode their parts of every shard in
    # lock-step
    predict_in_the_bucket(rigs.gcs, rigs.tpuft, run_url, "t5x")
    proxied = {url.split("/")[2] for method, url in rigs.proxy.requests if method != "CONNECT"}
    assert "www.googleapis.com" in proxied, proxied  # TensorFlow's GCS filesystem was in the path
    # nothing else
    assert not any(method == "CONNECT" for method, _ in rigs.proxy.requests), rigs.proxy.requests


def test_t5x_a_killed_host_fails_the_run_and_resume_finishes_on_gcp_rigs(rigs: Rigs) -> None:
    settings = [
        "--set",
        "train.steps=60",
        "--set",
        "train.warmup_steps=5",
        "--set",
        "train.log_every=10",
        "--set",
        "train.checkpoint_every=20",
        "--set",
        "eval.every=60",
        "--set",
        "eval.max_examples=40",
    ]
    started = rigs.tpuft("train", "t5x_quickstart", "--detach", "--json", *SOURCE, *settings, timeout=600)
    assert started.returncode == 0, started.stderr[-4000:]
    run_url = json.loads(started.stdout)["run_dir"]
    assert run_url.startswith(f"gs://{BUCKET}/runs/t5x_quickstart-")

    record = wait_until(
        lambda: rigs.json(run_url, "attempts/1/worker-1.json"), 300, "worker 1's supervisor record"
    )
    wait_until(
        lambda: 20 in rigs.checkpoints(run_url), 900, "the complete checkpoint at step 20", interval=0.2
    )
    os.kill(record["trainer_pid"], signal.SIGKILL)  # the sshd workers are processes of this machine
    killed_at = time.monotonic()
    info = wait_until(
        lambda: (i := rigs.json(run_url, "run.json")) and i.get("status") not in (None, "running") and i,
        300,
        "the run to fail",
    )
    print(
        f"\nt5x on the gcp rigs: the run failed {time.monotonic() - killed_at:.1f} s after a host's trainer "
        "was killed"
    )
    assert info["status"] == "failed" and info["culprit"] == 1, info
    assert info["cause"].startswith("slice 1 host 0 (worker 1)"), info  # the killed host is slice 1's
    peer = rigs.json(run_url, "attempts/1/worker-0.json") or {}
    # worker 0 did not hang in its collective
    assert peer.get("final") and peer.get("status") == "stopped", peer
    assert max(rigs.checkpoints(run_url)) < 60
    resumed_from = max(rigs.checkpoints(run_url))

    resumed = rigs.tpuft("resume", run_url.rsplit("/", 1)[-1], "--json")
    assert resumed.returncode == 0, resumed.stderr[-6000:]
    assert rigs.json(run_url, "run.json")["status"] == "finished"
    assert "resuming from checkpoint_" in (rigs.text(run_url, "logs/worker-0.log") or "")  # said by host 0
    for worker in (0, 1):  # both slices, in both attempts: one mesh over the slices
        log = rigs.text(run_url, f"logs/worker-{worker}.log") or ""
        assert log.count(f"multislice: slice {worker} of 2, host 0 of 1") == 2, log[-3000:]
        assert log.count("mesh replica 2 x data 1 x model 1") == 2, log[-3000:]
    train_steps = [r["step"] for r in rigs.rows(run_url) if "loss" in r]
    # rows after the checkpoint dropped and logged anew
    assert train_steps == [10, 20, 30, 40, 50, 60], train_steps
    assert max(rigs.checkpoints(run_url)) == 60
    # the resumed run ends with the run's one test
    tests = [r for r in rigs.rows(run_url) if "test_examples" in r]
    assert len(tests) == 1 and tests[0]["test_checkpoint_step"] == 60, tests
    assert "export/hf/model.safetensors" in rigs.names(run_url)
    restores = [e for e in rigs.events(run_url, 2) if e["kind"] == "checkpoint_restore"]
    # timed in T5X's start-up
    assert [e["step"] for e in restores] == [resumed_from] and restores[0]["s"] > 0, restores


def check_goodput_events(events: list[dict[str, Any]]) -> None:
    """What T5X's own loop did, timed through tpuft's hooks (tpuft.worker.loop.framework.Timeline): each
    save until complete (manifest written; T5X saves the starting state before its loop too), each evaluation
    (teacher-forced and inference at every eval step), each window's data wait."""
    saves = {e["step"]: e["reason"] for e in events if e["kind"] == "checkpoint_save"}
    assert saves == {0: "periodic", 20: "periodic", 40: "final"} and all(
        e["s"] > 0 for e in events if e["kind"] == "checkpoint_save"
    ), events
    evals = [e for e in events if e["kind"] == "eval"]
    assert sorted({e["step"] for e in evals}) == [20, 40] and all(e["s"] > 0 for e in evals), evals
    windows = [e for e in events if e["kind"] == "steps"]
    assert windows and all(0 < e["data_wait_s"] < e["s"] for e in windows), windows
