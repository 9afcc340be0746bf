"""The cluster file's ``worker_env`` reaches every worker process tpuft starts, ``exec`` and ``setup`` as well
as ``train`` (tests/e2e/test_recovery_rigs.py checks the trainers), through the one secret-safe channel: the
process environment on the local pod, the SSH channel's stdin on real OpenSSH servers
(tests/rigs/sshd_pod.py). While the commands run, no process on the machine has the value in its argv.
``setup`` is observed through the workers' base python: a wrapper that says what it sees, then runs the
bootstrap, which finds the backend venv built."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ops.argv_watch import ArgvWatch
from tests.ops.standin import RECIPE
from tests.rigs.fake_tpu import FakeTpuServer
from tests.rigs.gcs_emulator import GcsEmulator
from tests.rigs.sshd_pod import SshdPod, sshd_available
from tpuft.backends.torch_xla import BACKEND, TorchXlaBackend
from tpuft.host.bootstrap import MARKER

EXEC = 'sleep 1; echo "exec saw MY_SECRET=$MY_SECRET"'
WORKER_ENV = "worker_env: {MY_SECRET: '${TPUFT_TEST_TOKEN}', PLAIN: 'x'}\n"


@pytest.fixture
def marker(monkeypatch: pytest.MonkeyPatch) -> str:
    """The secret, named in the cluster file as ${TPUFT_TEST_TOKEN} and taken from the controller's
    environment."""
    value = f"tpuft-secret-{secrets.token_hex(8)}"
    monkeypatch.setenv("TPUFT_TEST_TOKEN", value)
    return value


def announcing_python(folder: Path) -> Path:
    """The workers' base python: says what MY_SECRET it sees (once the watch can see it run), then is
    python."""
    wrapper = folder / "announcing-python"
    wrapper.write_text(
        f'#!/bin/sh\nsleep 1\necho "setup saw MY_SECRET=$MY_SECRET"\nexec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def mark_venv_built(cache: Path, python: Path) -> None:
    """The recipe's venv, built from ``python``, as the bootstrap accepts it (see tests/ops/standin.py)."""
    venv = cache / BACKEND.env_spec(TorchXlaBackend(), "cpu", str(python)).key
    (venv / "bin").mkdir(parents=True)
    (venv / MARKER).write_text(json.dumps({"python": f"{sys.version_info.major}.{sys.version_info.minor}"}))


def test_exec_and_setup_see_worker_env_on_the_local_pod(tmp_path: Path, cli, marker: str) -> None:  # type: ignore[no-untyped-def]
    python = announcing_python(tmp_path)
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(
        f"name: env-pod\n{WORKER_ENV}local:\n  workers: 2\n  devices_per_worker: 1\n  venv_cache: "
        f"{tmp_path / 'venvs'}\n"
        f"  python: {python}\n"
    )
    mark_venv_built(tmp_path / "venvs", python)
    (tmp_path / "train.jsonl").write_text('{"source": "a", "target": "b"}\n' * 4)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE)
    assert cli("create", "-c", str(cluster)).code == 0

    with ArgvWatch(marker, "sleep 1; echo") as watch:
        executed = cli("exec", "-c", str(cluster), "--", EXEC)
    assert executed.code == 0, executed.err
    assert sorted(executed.out.splitlines()) == [f"[w{i}] exec saw MY_SECRET={marker}" for i in range(2)]
    assert watch.saw_probe and watch.in_argv == []

    with ArgvWatch(marker, str(python)) as watch:
        set_up = cli("setup", str(recipe), "-c", str(cluster))
    assert set_up.code == 0, set_up.err
    assert (
        set_up.out.count(f"setup saw MY_SECRET={marker}") == 2
        and set_up.out.count("venv ready (cached)") == 2
    )
    assert watch.saw_probe and watch.in_argv == []


@pytest.mark.skipif(not sshd_available(), reason="needs openssh-server (.ci/run installs it)")
def test_exec_and_setup_see_worker_env_on_ssh_workers(tmp_path: Path, marker: str, gcs: GcsEmulator) -> None:
    python = announcing_python(tmp_path)
    with FakeTpuServer(operation_polls=0) as tpu, SshdPod(tmp_path / "pod", workers=2) as pod:
        tpu.worker_addresses = pod.addresses
        tpu.host_keys.update(pod.host_keys)  # what the VMs' guest agents publish: tpuft pins them
        cluster = tmp_path / "tpuft.yaml"
        cluster.write_text(
            f"name: env-ssh\nprovider: gcp\naccelerator: v4-16\nbucket: gs://env-bucket\n{WORKER_ENV}"
            f"gcp:\n  project: tpuft-test\n  zone: us-central2-b\n  tpu_api_endpoint: {tpu.endpoint}\n"
            f"  worker_device: cpu\n  python: {python}\n  venv_cache: venvs\n"
            f"ssh:\n  user: {pod.user}\n  key_file: {pod.client_key}\n  port: {pod.port}\n"
        )
        for index in range(2):  # HOME-relative, as on GCP: each worker has its own
            mark_venv_built(pod.home(index) / "venvs", python)
        (tmp_path / "train.jsonl").write_text('{"source": "a", "target": "b"}\n' * 4)
        recipe = tmp_path / "r.yaml"
        recipe.write_text(RECIPE)
        env = {
            **os.environ,
            **gcs.env(),
            "TPUFT_HOME": str(tmp_path / "home"),
            "TPUFT_GCP_POLL_SECONDS": "0.02",
        }

        def tpuft(verb: str, *args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "tpuft", verb, "-c", str(cluster), *args],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )

        created = tpuft("create", "--yes")
        assert created.returncode == 0, created.stderr
        with ArgvWatch(marker, "sleep 1; echo") as watch:
            executed = tpuft("exec", "--", EXEC)
        assert executed.returncode == 0, executed.stderr
        # not a shell's noise
        seen = sorted(line for line in executed.stdout.splitlines() if "exec saw" in line)
        assert seen == [f"[w{i}] exec saw MY_SECRET={marker}" for i in range(2)]
        assert watch.saw_probe and watch.in_argv == []

        with ArgvWatch(marker, str(python)) as watch:
            set_up = tpuft("setup", str(recipe))
        assert set_up.returncode == 0, set_up.stderr
        assert set_up.stdout.count(f"setup saw MY_SECRET={marker}") == 2, set_up.stdout + set_up.stderr
        assert set_up.stdout.count("venv ready (cached)") == 2
        assert watch.saw_probe and watch.in_argv == []
