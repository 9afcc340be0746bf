"""The fleet contract (tpuft/fleet/base.py), the same cases against both fleets: local processes, and real
OpenSSH servers on loopback (tests/rigs/sshd_pod.py). Behaviour only one fleet has is tested in its own
file."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import alive
from tests.rigs.sshd_pod import SshdPod, sshd_available
from tpuft.core.errors import UsageError
from tpuft.core.records import Worker
from tpuft.fleet.base import Fleet
from tpuft.fleet.local import LocalFleet
from tpuft.fleet.ssh import SshFleet, SshSettings

WORKERS = 3


@dataclass
class Rig:
    fleet: Fleet
    home: Callable[[int], Path]


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdPod | None]:
    if not sshd_available():
        yield None
        return
    with SshdPod(tmp_path_factory.mktemp("contract-pod"), workers=WORKERS) as running:
        yield running


@pytest.fixture(params=["local", "ssh"])
def rig(request: pytest.FixtureRequest, tmp_path: Path, pod: SshdPod | None) -> Iterator[Rig]:
    if request.param == "local":
        homes = [tmp_path / f"worker-{i}" for i in range(WORKERS)]
        for home in homes:
            home.mkdir()
        yield Rig(
            LocalFleet([Worker(i, "localhost", home=h) for i, h in enumerate(homes)]), lambda i: homes[i]
        )
        return
    if pod is None:
        pytest.skip("needs openssh-server (.ci/run installs it)")
    for i in range(WORKERS):
        for name in ("child.pid", "shell.pid", "v.txt"):
            (pod.home(i) / name).unlink(missing_ok=True)
    fleet = SshFleet(
        [Worker(i, a) for i, a in enumerate(pod.addresses)], SshSettings(pod.user, pod.client_key, pod.port)
    )
    try:
        yield Rig(fleet, pod.home)
    finally:
        fleet.close()


def test_runs_everywhere_at_once_in_home_with_quoted_env_and_logs(rig: Rig, tmp_path: Path) -> None:
    lines: list[tuple[int, str]] = []
    tricky = 'it\'s a $HOME "test"; rm -rf /nothing `id`'
    started = time.monotonic()
    result = rig.fleet.run(
        ["bash", "-c", 'sleep 1; echo "id=$TPUFT_WORKER_ID home=$HOME"; echo "v=$V"; pwd'],
        env=lambda w: {"TPUFT_WORKER_ID": str(w.index), "V": tricky},
        log_dir=tmp_path / "logs",
        on_line=lambda i, line: lines.append((i, line)),
    )
    assert time.monotonic() - started < 2.9  # three 1 s sleeps at once, not one after another
    assert result.ok and [r.exit_code for r in result.results] == [0, 0, 0]
    for i in range(WORKERS):
        home = rig.home(i)
        assert {(i, f"id={i} home={home}"), (i, f"v={tricky}"), (i, str(home))} <= set(lines)
        log = (tmp_path / "logs" / f"worker-{i}.log").read_text()
        assert log == f"id={i} home={home}\nv={tricky}\n{home}\n"  # nothing of tpuft's own in a worker's log


def test_fail_fast_stops_the_others_whole_process_groups_and_names_the_culprit(rig: Rig) -> None:
    script = (
        'if [ "$ID" = 1 ]; then sleep 1; echo "boom"; exit 7; fi; '
        "sleep 300 & echo $! > child.pid; echo $$ > shell.pid; wait"
    )
    started = time.monotonic()
    result = rig.fleet.run(["bash", "-c", script], env=lambda w: {"ID": str(w.index)})
    assert time.monotonic() - started < 15
    assert result.first_failure == 1 and not result.ok
    by_index = {r.index: r for r in result.results}
    assert by_index[1].exit_code == 7 and by_index[1].tail == ["boom"]
    assert by_index[0].exit_code is None and by_index[2].exit_code is None  # stopped by tpuft, not failed
    for i in (0, 2):
        for name in ("child.pid", "shell.pid"):  # the background child too: the whole process group
            pid = int((rig.home(i) / name).read_text())
            assert not alive(pid), f"worker {i} {name} {pid} survived"


def test_put_copies_folders_and_files_to_the_chosen_workers(rig: Rig, tmp_path: Path) -> None:
    source = tmp_path / "pkg"
    (source / "sub").mkdir(parents=True)
    (source / "a.py").write_text("print('a')\n")
    (source / "sub" / "b.txt").write_text("bee")
    single = tmp_path / "recipe.yaml"
    single.write_text("name: x\n")
    rig.fleet.put(source, ".tpuft/pkg/abc/tpuft")
    rig.fleet.put(single, "runs/r1/recipe.yaml", workers=[2])
    for i in range(WORKERS):
        assert (rig.home(i) / ".tpuft/pkg/abc/tpuft/sub/b.txt").read_text() == "bee"
        assert (rig.home(i) / ".tpuft/pkg/abc/tpuft/a.py").read_text() == "print('a')\n"
    assert (rig.home(2) / "runs/r1/recipe.yaml").read_text() == "name: x\n"
    assert not (rig.home(0) / "runs/r1/recipe.yaml").exists()


def test_runs_on_the_chosen_workers_only(rig: Rig) -> None:
    lines: list[tuple[int, str]] = []
    result = rig.fleet.run(
        ["bash", "-c", "echo here"], workers=[2, 0], on_line=lambda i, line: lines.append((i, line))
    )
    assert [r.index for r in result.results] == [2, 0] and sorted(lines) == [(0, "here"), (2, "here")]


def test_an_environment_name_is_refused_before_any_command_runs(rig: Rig) -> None:
    """Every bad name in one test, so the wait that proves worker 0 never touched its marker is waited
    once."""
    names = ["X=1 touch owned; Y", "A B", "", "1X", "X\nY"]
    markers = [rig.home(0) / f"started-{i}" for i in range(len(names))]
    for name, marker in zip(names, markers):
        marker.unlink(missing_ok=True)
        with pytest.raises(UsageError, match="is not an environment variable name"):
            rig.fleet.run(
                ["bash", "-c", f"sleep 1; touch {marker.name}"],
                env=lambda w, name=name: {"OK": "1"} if w.index == 0 else {name: "v"},
            )  # type: ignore[misc]
    time.sleep(1.3)
    assert [
        m.name for m in markers if m.exists()
    ] == []  # worker 0, if it was started, was stopped with the rest


def test_the_fleet_checks_environment_names_by_the_cluster_files_rule() -> None:
    from tpuft.core import formats
    from tpuft.fleet import base

    assert base.ENV_NAME.pattern == formats.ENV_NAME.pattern
