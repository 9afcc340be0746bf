"""doctor: every worker of the launch plan is asked, in parallel, what would break the run; each problem is
named at its worker with its culprit, and the exit code says whether the run would break (1) or not (0,
warnings included).

The local pod has no TPU and its coordinator port is picked free at launch, so the TPU-host checks and the
fixed coordinator port are tested on an sshd pod planned as TPU hosts (``gcp.worker_device: tpu``), with fake
chips and a fake libtpu lockfile under each worker's HOME that the probe is pointed at by
``TPUFT_DOCTOR_TPU_PATHS``, an environment variable for tests only."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ops.standin import RECIPE, RigProvider, built_venv, worker_home
from tests.rigs.sshd_pod import SshdPod, sshd_available
from tpuft.config import load_cluster, load_recipe
from tpuft.core.ports import free_port
from tpuft.core.records import Cluster, State, Worker
from tpuft.fleet.ssh import SshFleet, SshSettings
from tpuft.host.bootstrap import MARKER
from tpuft.host.state import STATE_DIR, start_ticks
from tpuft.ops import doctor
from tpuft.ops.common import Session, ship_package
from tpuft.ops.doctor_checks import CONTROLLER, judge_clock, judge_disk
from tpuft.ops.setup import env_spec

PY = f"{sys.version_info.major}.{sys.version_info.minor}"
EIGHT = RECIPE.replace("batch_size: 2", "batch_size: 8")
"""The stand-in recipe with a batch that splits over a v4-16's 8 chips, and over a local pod rehearsing
them."""


def _statuses(report: dict) -> dict[tuple[int, str], str]:  # type: ignore[type-arg]
    return {(c["worker"], c["check"]): c["status"] for c in report["checks"]}


def test_a_healthy_local_pod_passes_and_a_cut_off_venv_and_a_busy_worker_are_named(
    tmp_path: Path, cli
) -> None:  # type: ignore[no-untyped-def]
    cluster, recipe, venv = built_venv(tmp_path, cli, recipe=EIGHT)
    assert cli("setup", str(recipe), "-c", str(cluster)).code == 0  # ships this tpuft
    healthy = cli("doctor", str(recipe), "-c", str(cluster), "--json")
    assert healthy.code == 0, healthy.out + healthy.err
    report = json.loads(healthy.out)
    assert report["ok"] and report["problems"] == [] and report["warnings"] == []
    statuses = _statuses(report)
    assert {check for (_, check), status in statuses.items() if status == "ok"} == {
        "free",
        "venv",
        "tpuft",
        "disk",
        "clock",
    }
    assert statuses[(CONTROLLER, "disk")] == "ok"  # the local run storage, on this machine
    assert statuses[(0, "port")] == "skip"  # a local pod's coordinator port is picked free at launch

    (venv / MARKER).unlink()  # no marker: the workers share the local pod's venv cache
    # ... while a real setup's bootstrap builds it: a child process holds the build lock as bootstrap does
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from tpuft.host.bootstrap import build_lock\n"
            f"with build_lock(Path({str(venv.parent)!r}), {venv.name!r}):\n"
            "    print('holding', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        building = cli("doctor", str(recipe), "-c", str(cluster), "--json")
    finally:
        holder.communicate("", timeout=60)  # its stdin closes: it lets the lock go and ends
    assert building.code == 0, building.out + building.err  # a build under way is not a failure
    report = json.loads(building.out)
    for index in (0, 1):
        [finding] = [c for c in report["checks"] if c["worker"] == index and c["check"] == "venv"]
        assert (finding["status"], finding["cell"]) == ("warn", "building"), finding
        assert f"is being built now by pid {holder.pid} on " in finding["detail"], finding
        assert "cut off" not in finding["detail"] and "tpuft setup" not in finding["detail"]
    # worker 1's supervisor serves a live run (this process)
    current = worker_home(1) / STATE_DIR / "current.json"
    current.parent.mkdir(parents=True)
    current.write_text(
        json.dumps(
            {
                "run_id": "r-1",
                "status": "running",
                "supervisor_pid": os.getpid(),
                "supervisor_ticks": start_ticks(os.getpid()),
            }
        )
    )
    broken = cli("doctor", str(recipe), "-c", str(cluster))
    assert broken.code == 1, broken.out + broken.err
    for index in (0, 1):
        assert f"problem: worker {index}: venv: the venv {venv} has no completion marker" in broken.out
    assert f"problem: worker 1: free: run r-1 is training here (supervisor pid {os.getpid()})" in broken.out
    assert "worker 0: free" not in broken.out
    assert "run: tpuft setup t" in broken.out  # the recipe's name and "all checks pass" not in broken.out


def test_disk_and_clock_verdicts_say_the_numbers() -> None:
    spec = {"venv": {"cache": "venvs"}}
    small = {"free": 2 * 2**30, "device": 1, "at": "/home/u", "total": 0}
    data = {"venv": {"state": "missing"}, "disk": {"~": small, "venvs": small}}
    check, status, _, detail, _ = judge_disk(data, spec, checkpoint=0, keep=4)
    assert (check, status) == (
        "disk",
        "fail",
    ) and "2 GiB free at /home/u, needs 8 GiB (a venv ~8 GiB)" in detail
    ready = {**data, "venv": {"state": "ready"}}
    assert judge_disk(ready, spec, checkpoint=2**29, keep=4)[1] == "ok"  # 4 checkpoints of 0.5 GiB in 2 GiB
    assert judge_disk(ready, spec, checkpoint=2**29 + 1, keep=4)[1] == "fail"
    assert judge_clock(0, 0.4, 0.1).status == "ok"
    assert judge_clock(0, 1.5, 0.2).status == "warn"  # surely more than a second off
    assert judge_clock(0, 1.5, 1.2).status == "ok"  # within a second, as far as a 1.2 s round trip can tell
    assert judge_clock(1, -20.0, 0.1).status == "fail"


def _venv_with_libtpu(home: Path, key: str) -> Path:
    """A venv the bootstrap counts as built whose python finds a stand-in ``libtpu`` (under the worker's
    HOME)."""
    venv = home / "venvs" / key
    (venv / "bin").mkdir(parents=True)
    (venv / MARKER).write_text(json.dumps({"python": PY, "base_python": PY}))
    (home / "lib" / "libtpu").mkdir(parents=True)
    (home / "lib" / "libtpu" / "__init__.py").write_text("")
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/bash\nexport PYTHONPATH={home / "lib"}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    (home / "dev").mkdir()
    (home / "dev" / "accel0").write_text("")  # a chip, as far as the probe is told
    return venv


@pytest.mark.skipif(not sshd_available(), reason="needs openssh-server (.ci/run installs it)")
def test_tpu_hosts_name_a_stale_chip_holder_a_taken_port_a_stale_lockfile_and_no_libtpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The coordinator's port is checked on every address of the machine, where anything may listen on the
    # fixed one (another program on a CI machine): the test's coordinator port is one the kernel says is free
    # now.
    port, cross_slice = free_port(), free_port()
    monkeypatch.setattr(doctor, "COORDINATOR_PORT", port)
    monkeypatch.setattr(doctor, "MEGASCALE_PORT", cross_slice)
    monkeypatch.setenv(
        "TPUFT_DOCTOR_TPU_PATHS", json.dumps({"devices": ["~/dev/accel"], "lockfile": "~/libtpu_lockfile"})
    )
    (tmp_path / "train.jsonl").write_text('{"source": "a", "target": "b"}\n')
    (tmp_path / "r.yaml").write_text(EIGHT)
    recipe = load_recipe(tmp_path / "r.yaml").value
    with SshdPod(tmp_path / "pod", workers=2) as pod:
        (tmp_path / "tpuft.yaml").write_text(
            f"name: rig\nprovider: gcp\naccelerator: v4-16\nbucket: gs://rig-bucket\n"
            f"gcp: {{project: tpuft-test, zone: us-central2-b, python: {sys.executable}, "
            f"venv_cache: venvs}}\n"
            f"ssh: {{user: {pod.user}, key_file: {pod.client_key}, port: {pod.port}}}\n"
        )
        config = load_cluster(tmp_path / "tpuft.yaml").value
        # Two slices of one host: the reachability preflight checks the cross-slice port too.
        workers = [
            Worker(i, address, internal_address=address, slice=i) for i, address in enumerate(pod.addresses)
        ]
        fleet = SshFleet(workers, SshSettings(user=pod.user, key_file=pod.client_key, port=pod.port))
        cluster = Cluster("rig", "gcp", State.READY, "v4-16", workers, bucket="gs://rig-bucket")
        session = Session(config=config, provider=RigProvider(fleet), cluster=cluster)  # type: ignore[arg-type]
        holder = None
        try:
            assert session.shape.target == "tpu"
            key = env_spec(session, recipe).key
            for index in (0, 1):
                _venv_with_libtpu(pod.home(index), key)
            ship_package(session, [0, 1])
            healthy = doctor.examine(session, recipe)
            # The checks this test stages must pass; disk and clock are this machine's own (a CI machine's
            # full disk is a true finding, not this test's), so they only must not be failures of the staged
            # kind.
            staged = {
                (0, "libtpu"),
                (1, "libtpu"),
                (0, "TPU chips"),
                (1, "TPU chips"),
                (0, "libtpu lock"),
                (1, "libtpu lock"),
                (0, "port"),
                (0, "venv"),
                (1, "venv"),
                (0, "tpuft"),
                (1, "tpuft"),
                (0, "free"),
                (1, "free"),
                (0, "reach"),
                (1, "reach"),
            }
            assert {(f.worker, f.check) for f in healthy.findings if f.status == "ok"} >= staged, (
                healthy.problems(),
                healthy.warnings(),
            )
            assert {f.check for f in healthy.findings if f.status not in ("ok", "skip")} <= {
                "disk",
                "clock",
            }, (healthy.problems(), healthy.warnings())

            # a firewall that lets 8081 through no more
            monkeypatch.setenv("TPUFT_DOCTOR_SKIP_LISTEN", str(cross_slice))
            walled = {
                (f.worker, f.check): f for f in doctor.examine(session, recipe).findings if f.check == "reach"
            }
            monkeypatch.delenv("TPUFT_DOCTOR_SKIP_LISTEN")
            assert walled[(0, "reach")].status == "ok" and walled[(1, "reach")].status == "fail"
            assert walled[(1, "reach")].detail == (
                f"slice 1 host 0 (worker 1) cannot reach slice 0 host 0 at {pod.addresses[0]}:{cross_slice} "
                f"(refused): allow tcp:{port},tcp:{cross_slice} from the TPU hosts' range in the VPC network "
                "default: gcloud compute firewall-rules create tpuft-rig-internal --network=default "
                f"--allow=tcp:{port},tcp:{cross_slice} "
                "--source-ranges=127.0.0.0/16"
            )

            holder = subprocess.Popen(  # a crashed run's trainer that still holds worker 0's chip
                [
                    sys.executable,
                    "-c",
                    "import sys, time; f = open(sys.argv[1]); print('open', flush=True); time.sleep(60)",
                    str(pod.home(0) / "dev" / "accel0"),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
            (pod.home(1) / "libtpu_lockfile").write_text("")  # left by a process that is gone
            shutil.rmtree(pod.home(1) / "lib" / "libtpu")
            with socket.socket() as taken:
                taken.bind((pod.addresses[0], port))
                taken.listen(1)
                broken = doctor.examine(session, recipe)
        finally:
            if holder is not None:
                holder.kill()
                holder.wait()
            fleet.close()
    failed = {(f.worker, f.check): f for f in broken.findings if f.status == "fail"}
    assert sorted(failed) == [(0, "TPU chips"), (0, "port"), (1, "libtpu"), (1, "libtpu lock")], (
        broken.as_json()
    )
    assert (
        f"held by pid {holder.pid}" in failed[(0, "TPU chips")].detail
        and failed[(0, "TPU chips")].train_handles
    )
    assert f"port {port} is taken" in failed[(0, "port")].detail
    assert f"by pid {os.getpid()} " in failed[(0, "port")].detail  # this test's listening socket
    assert "No module named 'libtpu'" in failed[(1, "libtpu")].detail
    assert (
        "libtpu_lockfile is left by a process that is gone: train removes it"
        in failed[(1, "libtpu lock")].detail
    )
    # What train would still trip over (it kills its user's chip holders and removes a stale lockfile itself):
    assert broken.problems(before_train=True) == [failed[(0, "port")].line(), failed[(1, "libtpu")].line()]
