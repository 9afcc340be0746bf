"""setup: ships the tpuft package to the workers of the backend's launch plan and runs the venv bootstrap
there, in parallel; a venv already built is reused (here one marked built: see tests/ops/standin.py). Local
sources of a venv (a t5x wheel, say) are shipped to SSH workers, which cannot read this machine's disk, and
installed from there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.ops.standin import RigProvider, built_venv
from tests.rigs.sshd_pod import SshdPod, sshd_available
from tests.venvs import tiny_wheel
from tpuft.backends.base import EnvSpec
from tpuft.core.records import Cluster, State, Worker
from tpuft.fleet.ssh import SshFleet, SshSettings
from tpuft.ops.common import Session, package_hash, ship_package
from tpuft.ops.setup import bootstrap_argv, ship_sources


def test_setup_ships_the_package_and_finds_the_venv_on_every_planned_worker(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    cluster, recipe, venv = built_venv(tmp_path, cli, None)
    result = cli("setup", str(recipe), "-c", str(cluster), "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["venv"] == str(venv) and report["backend"] == "torch_xla"
    homes = [
        Path(os.environ["TPUFT_HOME"]) / "local" / "stand-in" / "workers" / f"worker-{i}" for i in range(2)
    ]
    for home in homes:
        shipped = home / ".tpuft" / "pkg" / package_hash() / "tpuft"
        assert (shipped / "host" / "bootstrap.py").is_file() and not list(shipped.rglob("__pycache__"))
        assert not (shipped / "recipes").exists()  # the shipped recipes and their data stay home (MBs)
    assert result.err.count("venv ready (cached)") == 2  # each worker checked it, none rebuilt it


def _session(workers: list[Worker], fleet: SshFleet | None = None) -> Session:
    cluster = Cluster(name="rig", provider="gcp", state=State.READY, accelerator="v4-16", workers=workers)
    return Session(config=None, provider=RigProvider(fleet), cluster=cluster)  # type: ignore[arg-type]


def _source_spec(wheel: Path) -> EnvSpec:
    return EnvSpec(
        kind="unit",
        requirements=("pip",),
        python=sys.executable,
        pip_args=("--no-index",),
        no_deps=(str(wheel),),
        local_sources=(str(wheel),),
        sources_digest="d1",
    )


def test_local_workers_install_local_sources_from_where_they_are(tmp_path: Path) -> None:
    session = _session([Worker(i, "localhost", home=tmp_path / f"worker-{i}") for i in range(2)])
    assert ship_sources(session, _source_spec(tiny_wheel(tmp_path)), [0, 1]) is None


@pytest.mark.skipif(not sshd_available(), reason="needs openssh-server (.ci/run installs it)")
def test_local_sources_are_shipped_to_ssh_workers_and_installed_there(tmp_path: Path) -> None:
    wheel = tiny_wheel(tmp_path / "wheels", requires=("tpuft-no-such-package",))
    spec = _source_spec(wheel)
    git = "tpuft-git-stand-in @ git+https://example.invalid/x"
    with SshdPod(tmp_path / "pod", workers=2) as pod:
        workers = [Worker(i, address) for i, address in enumerate(pod.addresses)]
        fleet = SshFleet(workers, SshSettings(user=pod.user, key_file=pod.client_key, port=pod.port))
        try:
            session = _session(workers, fleet)
            package = ship_package(session, [0, 1])
            shipped = f"~/.tpuft/sources/d1/{wheel.name}"
            assert ship_sources(session, replace(spec, no_deps=(str(wheel), git)), [0, 1]) == (shipped, git)
            no_deps = ship_sources(session, spec, [0, 1])
            assert no_deps == (shipped,)
            result = fleet.run(bootstrap_argv(session, package, spec, no_deps=no_deps), workers=[0, 1])
            assert result.ok, [r.tail for r in result.results]
            check = fleet.run(
                bootstrap_argv(session, package, spec, check=True), workers=[0, 1], fail_fast=False
            )
            assert [r.exit_code for r in check.results] == [0, 0]  # what train checks before launching
        finally:
            fleet.close()
        for index in range(2):
            venv = pod.home(index) / "venvs" / spec.key
            marker = json.loads((venv / ".tpuft-complete").read_text())
            assert marker["no_deps"] == [str(pod.home(index) / ".tpuft" / "sources" / "d1" / wheel.name)]
            imported = subprocess.run(
                [str(venv / "bin" / "python"), "-c", "import tpuft_tiny; print(tpuft_tiny.VALUE)"],
                capture_output=True,
                text=True,
                check=True,
            )
            assert imported.stdout.strip() == "42"
