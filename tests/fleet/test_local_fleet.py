"""The local fleet's own behaviour (the shared contract is in test_fleet_contract.py): a worker that ignores
SIGTERM, and Ctrl-C or SIGTERM to a real tpuft process leaving no worker process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import alive, default_sigint, wait_for_files
from tpuft.core.records import Worker
from tpuft.fleet.local import LocalFleet

REPO = Path(__file__).resolve().parents[2]


def make_workers(tmp_path: Path, count: int) -> list[Worker]:
    workers = []
    for i in range(count):
        home = tmp_path / f"worker-{i}"
        home.mkdir()
        workers.append(Worker(index=i, address="localhost", home=home))
    return workers


def test_sigterm_ignored_gets_killed_after_grace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tpuft.fleet.local as local

    monkeypatch.setattr(local, "STOP_GRACE_SECONDS", 0.5)
    workers = make_workers(tmp_path, 2)
    script = (
        'if [ "$TPUFT_WORKER_ID" = 1 ]; then sleep 0.3; exit 1; fi; trap "" TERM; echo $$ > shell.pid; '
        "while true; do sleep 0.1; done"
    )
    started = time.monotonic()
    result = LocalFleet(workers).run(["bash", "-c", script], env=lambda w: {"TPUFT_WORKER_ID": str(w.index)})
    assert time.monotonic() - started < 5
    assert result.first_failure == 1
    assert not alive(int((workers[0].home / "shell.pid").read_text()))


TYPER_ENTRY = "import sys; sys.argv = ['tpuft', *sys.argv[1:]]; from tpuft.cli import main; main()"
"""The Typer app's own entry (what `tpuft exec` runs when the fast launcher does not answer it)."""


@pytest.mark.parametrize("entry", ["launcher", "typer"])
def test_ctrl_c_on_tpuft_stops_every_worker_process(tmp_path: Path, cluster_file: Path, entry: str) -> None:
    """A real `tpuft exec` process gets SIGINT (what Ctrl-C sends); no worker process may survive it,
    whichever of the two ways into tpuft ran the command."""
    env = {**os.environ, "COLUMNS": "200"}
    subprocess.run(
        [sys.executable, "-m", "tpuft", "create", "-c", str(cluster_file)],
        check=True,
        env=env,
        capture_output=True,
    )
    script = "sleep 300 & echo $! > child.pid; echo $$ > shell.pid; wait"
    head = [sys.executable, "-m", "tpuft"] if entry == "launcher" else [sys.executable, "-c", TYPER_ENTRY]
    proc = subprocess.Popen(
        [*head, "exec", "-c", str(cluster_file), "--", script],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    homes = [
        Path(os.environ["TPUFT_HOME"]) / "local" / "test-pod" / "workers" / f"worker-{i}" for i in range(2)
    ]
    pid_files = [h / name for h in homes for name in ("child.pid", "shell.pid")]
    wait_for_files(pid_files)
    pids = [int(p.read_text()) for p in pid_files]
    assert all(alive(pid) for pid in pids)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    # Every process group got SIGKILL before tpuft returned; the kernel ends a killed process when it next
    # runs, which on a loaded machine can be a moment later: a few seconds at most, never "survived".
    deadline = time.monotonic() + 5.0
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in pids if alive(pid)] == []


def test_sigterm_on_tpuft_also_cleans_up(tmp_path: Path, cluster_file: Path) -> None:
    env = {**os.environ, "COLUMNS": "200"}
    subprocess.run(
        [sys.executable, "-m", "tpuft", "create", "-c", str(cluster_file)],
        check=True,
        env=env,
        capture_output=True,
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tpuft",
            "exec",
            "-c",
            str(cluster_file),
            "--",
            "echo $$ > shell.pid; sleep 300",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    homes = [
        Path(os.environ["TPUFT_HOME"]) / "local" / "test-pod" / "workers" / f"worker-{i}" for i in range(2)
    ]
    wait_for_files([h / "shell.pid" for h in homes])
    pids = [int((h / "shell.pid").read_text()) for h in homes]
    proc.terminate()
    proc.communicate(timeout=20)
    assert [pid for pid in pids if alive(pid)] == []
