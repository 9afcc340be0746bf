"""``gcp.api: compute`` end to end on the stand-ins: the fake Compute Engine API makes a spot TPU7x slice
(``tpu7x-16``: a managed instance group of two hosts with a workload policy) whose instances are the sshd
pod's workers, in TPU worker-id order; the run dir lives in the emulated bucket. Workers run the real
PyTorch/XLA trainer on CPU (``gcp.worker_device: cpu``).

One run, watched with ``--recover``: once a checkpoint is in the bucket, ``tpuft drill preempt --worker 1``
stops host 1's instance (TERMINATED, as a spot preemption with termination action STOP leaves
it) and the test kills what ran on that host, as the VM going away does; host 0 runs on. The watcher names
the instance, stops host 0's trainer (its last checkpoint reaches the bucket), deletes the slice (group,
policy, template), creates it again, sets it up and resumes from the last
checkpoint; the run ends with the step count of an uninterrupted one, its test evaluation and export done, one
recovery recorded. ``tpuft delete`` then leaves nothing in the project.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.e2e.gcp_rig import bucket_json, few_test_numbers, rig_cluster, staged_step
from tests.rigs.fake_compute import FakeComputeServer
from tests.rigs.gcs_emulator import GcsEmulator
from tests.rigs.sshd_pod import SshdPod, kill_processes_with_home_under, sshd_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.backend_venvs("torch_xla"),
    pytest.mark.skipif(not sshd_available(), reason="needs openssh-server"),
]

RECOVER = "recover: {max_attempts: 2, backoff: 1s, poll: 2s}\n"
TOTAL = 400


def run_dirs(pod: SshdPod) -> list[str]:
    runs = pod.home(0) / ".tpuft" / "runs"
    return sorted(p.name for p in runs.iterdir()) if runs.exists() else []


def bucket_checkpoints(run_url: str) -> list[int]:
    """Complete checkpoints by tpuft's own reading of the bucket (the manifest present and matching)."""
    from tpuft.backends.torch_xla_schema import LAYOUT
    from tpuft.storage import open_storage

    return sorted(LAYOUT.checkpoint_steps(open_storage(run_url)))


def test_a_preempted_spot_tpu7x_slice_is_recreated_and_the_run_ends_as_an_uninterrupted_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (
        FakeComputeServer(operation_polls=1) as compute,
        SshdPod(tmp_path / "pod", workers=2) as pod,
        GcsEmulator() as gcs,
    ):
        cluster, env = rig_cluster(tmp_path, compute, pod, gcs)
        for key, value in gcs.env().items():  # this process reads the bucket as the controller does
            monkeypatch.setenv(key, value)
        cluster.write_text(cluster.read_text().replace("gcp:\n", "gcp:\n  spot: true\n") + RECOVER)

        def tpuft(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "tpuft", *args, "-c", str(cluster)],
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )

        few = few_test_numbers(tmp_path, 16)  # what matters is that the recovered run tests once
        args = [
            *(
                "--set",
                f"train.steps={TOTAL}",
                "--set",
                "train.warmup_steps=5",
                "--set",
                "train.log_every=10",
            ),
            *(
                "--set",
                "eval.every=1000",
                "--set",
                "eval.max_examples=16",
                "--set",
                "train.checkpoint_every=20",
            ),
            *("--set", f"data.test={few}"),
        ]
        out = tmp_path / "watcher.out"
        watcher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tpuft",
                "up",
                "quickstart",
                "-c",
                str(cluster),
                "--yes",
                "--recover",
                "--json",
                *args,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=out.open("w"),
            text=True,
        )
        try:
            wait_until(lambda: run_dirs(pod), 600, "the run on worker 0")
            run_url = f"gs://e2e-bucket/runs/{run_dirs(pod)[0]}"
            # the drill once a checkpoint is in the bucket (the workers sync every 15 s), well before the end
            wait_until(lambda: bucket_checkpoints(run_url), 900, "a checkpoint in the bucket", interval=0.5)
            reached = staged_step(pod, 0)
            assert reached < TOTAL - 100, (
                f"the run reached step {reached} before the drill: give it more steps"
            )
            (host1,) = [
                i for i in compute.instances() if i["networkInterfaces"][0]["networkIP"] == pod.addresses[1]
            ]
            drilled = tpuft("drill", "preempt", "--worker", "1", "--yes", "--json")
            assert drilled.returncode == 0, drilled.stderr[-3000:]
            assert json.loads(drilled.stdout)["detail"]["instance"] == host1["name"]
            kill_processes_with_home_under(pod.home(1))  # the VM goes with everything on it
            stdout, _ = watcher.communicate(timeout=900)
        finally:
            if watcher.poll() is None:
                watcher.kill()
        log = out.read_text()
        assert watcher.returncode == 0, f"{log[-6000:]}\nstdout:\n{stdout[-3000:]}"
        summary = json.loads(stdout)
        assert summary["last_train"]["step"] == TOTAL and summary["test"]["test_examples"] == 16, summary
        run_id = summary["run_id"]
        info = bucket_json(gcs, f"runs/{run_id}/run.json")
        assert info["status"] == "finished" and info["attempt"] == 2, info
        (recovery,) = info["recoveries"]
        assert f"instance {host1['name']} (host 1) TERMINATED" in recovery["cause"] and recovery["recreated"]
        assert recovery["checkpoint_step"] >= 20 and recovery["steps_lost"] == (
            recovery["last_step"] - recovery["checkpoint_step"]
        ), (recovery, log[-5000:])
        # host 0 ran on when host 1 went: the watcher stopped its trainer before deleting the slice, and its
        # last upload is what the run resumed from
        assert "stopping the trainers of the slices still up" in log, log[-4000:]
        assert bucket_json(gcs, f"runs/{run_id}/export/hf/config.json") is not None
        # the slice was made twice: one group each time, from a template and policy made again
        assert len(compute.calls("instanceGroupManagers.insert")) == 2
        assert len(compute.calls("instanceGroupManagers.delete")) == 1
        assert host1["name"] not in {i["name"] for i in compute.instances()}  # new hosts, new names

        gone = tpuft("delete", "--yes")
        assert gone.returncode == 0, gone.stderr[-3000:]
        assert not any(compute.resources().values()), compute.resources()
