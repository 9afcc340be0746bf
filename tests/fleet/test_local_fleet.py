"""The local fleet: parallel, prefixed output, per-worker logs, fail-fast and Ctrl-C leave no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import default_sigint
from tpuft.fleet.local import LocalFleet
from tpuft.records import Worker

REPO = Path(__file__).resolve().parents[2]


def make_workers(tmp_path: Path, count: int) -> list[Worker]:
    workers = []
    for i in range(count):
        home = tmp_path / f"worker-{i}"
        home.mkdir()
        workers.append(Worker(index=i, address="localhost", home=home))
    return workers


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for_files(paths: list[Path], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(p.exists() and p.read_text().strip() for p in paths):
            return
        time.sleep(0.05)
    raise AssertionError(f"not written in time: {[str(p) for p in paths if not p.exists()]}")


def test_runs_in_parallel_with_private_homes_and_logs(tmp_path: Path) -> None:
    workers = make_workers(tmp_path, 3)
    lines: list[tuple[int, str]] = []
    started = time.monotonic()
    result = LocalFleet(workers).run(
        ["bash", "-c", 'sleep 1; echo "home=$HOME id=$TPUFT_WORKER_ID"'],
        env=lambda w: {"TPUFT_WORKER_ID": str(w.index)},
        log_dir=tmp_path / "logs",
        on_line=lambda i, line: lines.append((i, line)),
    )
    assert time.monotonic() - started < 2.5  # three 1 s sleeps at once, not one after another
    assert result.ok and [r.exit_code for r in result.results] == [0, 0, 0]
    for w in workers:
        assert (w.index, f"home={w.home} id={w.index}") in lines
        assert (tmp_path / "logs" / f"worker-{w.index}.log").read_text() == f"home={w.home} id={w.index}\n"


def test_fail_fast_stops_the_others_and_names_the_culprit(tmp_path: Path) -> None:
    workers = make_workers(tmp_path, 3)
    script = (
        'if [ "$TPUFT_WORKER_ID" = 1 ]; then sleep 0.5; echo "boom on one"; exit 7; fi; '
        "sleep 300 & echo $! > child.pid; echo $$ > shell.pid; wait"
    )
    started = time.monotonic()
    result = LocalFleet(workers).run(["bash", "-c", script], env=lambda w: {"TPUFT_WORKER_ID": str(w.index)})
    assert time.monotonic() - started < 10
    assert not result.ok
    assert result.first_failure == 1
    by_index = {r.index: r for r in result.results}
    assert by_index[1].exit_code == 7 and by_index[1].tail == ["boom on one"]
    assert by_index[0].exit_code is None and by_index[2].exit_code is None  # stopped by us
    for w in (workers[0], workers[2]):
        for name in ("child.pid", "shell.pid"):
            pid = int((w.home / name).read_text())
            assert not alive(pid), f"worker {w.index} {name} {pid} survived"


def test_sigterm_ignored_gets_killed_after_grace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tpuft.fleet.local as local

    monkeypatch.setattr(local, "STOP_GRACE_SECONDS", 0.5)
    workers = make_workers(tmp_path, 2)
    script = 'if [ "$TPUFT_WORKER_ID" = 1 ]; then sleep 0.3; exit 1; fi; trap "" TERM; echo $$ > shell.pid; while true; do sleep 0.1; done'
    started = time.monotonic()
    result = LocalFleet(workers).run(["bash", "-c", script], env=lambda w: {"TPUFT_WORKER_ID": str(w.index)})
    assert time.monotonic() - started < 5
    assert result.first_failure == 1
    assert not alive(int((workers[0].home / "shell.pid").read_text()))


def test_ctrl_c_on_tpuft_stops_every_worker_process(tmp_path: Path, cluster_file: Path) -> None:
    """A real `tpuft exec` process gets SIGINT (what Ctrl-C sends); no worker process may survive it."""
    env = {**os.environ, "COLUMNS": "200"}
    subprocess.run([sys.executable, "-m", "tpuft", "create", "-c", str(cluster_file)], check=True, env=env, capture_output=True)
    script = "sleep 300 & echo $! > child.pid; echo $$ > shell.pid; wait"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpuft", "exec", "-c", str(cluster_file), "--", script],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    homes = [Path(os.environ["TPUFT_HOME"]) / "local" / "test-pod" / "workers" / f"worker-{i}" for i in range(2)]
    pid_files = [h / name for h in homes for name in ("child.pid", "shell.pid")]
    wait_for_files(pid_files)
    pids = [int(p.read_text()) for p in pid_files]
    assert all(alive(pid) for pid in pids)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert [pid for pid in pids if alive(pid)] == []


def test_sigterm_on_tpuft_also_cleans_up(tmp_path: Path, cluster_file: Path) -> None:
    env = {**os.environ, "COLUMNS": "200"}
    subprocess.run([sys.executable, "-m", "tpuft", "create", "-c", str(cluster_file)], check=True, env=env, capture_output=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpuft", "exec", "-c", str(cluster_file), "--", "echo $$ > shell.pid; sleep 300"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    homes = [Path(os.environ["TPUFT_HOME"]) / "local" / "test-pod" / "workers" / f"worker-{i}" for i in range(2)]
    wait_for_files([h / "shell.pid" for h in homes])
    pids = [int((h / "shell.pid").read_text()) for h in homes]
    proc.terminate()
    proc.communicate(timeout=20)
    assert [pid for pid in pids if alive(pid)] == []


def test_bad_environment_names_are_refused_before_any_worker_starts(tmp_path: Path) -> None:
    from tpuft.errors import UsageError

    workers = make_workers(tmp_path, 2)
    marker = tmp_path / "started"
    fleet = LocalFleet(workers)
    names = {0: "GOOD", 1: "BAD NAME"}
    with pytest.raises(UsageError, match="worker 1: 'BAD NAME' is not an environment variable name"):
        fleet.run(["bash", "-c", f"sleep 2; touch {marker}"], env=lambda w: {names[w.index]: "x"})
    time.sleep(2.5)
    assert not marker.exists()  # worker 0 had started: it was stopped, not left running unwatched
