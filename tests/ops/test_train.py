"""Runs live on the workers, under their supervisors: the controller's side of train, attach, stop, resume and
delete, on the local pod, with the stand-in trainer of tests/ops/standin.py (real supervisors, real processes,
no torch).

Each test drives ``python -m tpuft`` as a user would (a subprocess, so that it can be killed or sent Ctrl-C)
and checks what is left on the workers by pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import default_sigint, wait_until
from tests.ops.standin import built_venv, script, worker_home
from tpuft.run.cost import chips_of, run_cost
from tpuft.worker.supervisor.process import is_alive as alive


def tpuft(*args: str, **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tpuft", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
        env={**os.environ, "COLUMNS": "200"},
        **kwargs,
    )


def run_tpuft(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuft", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


def trainer_pids() -> list[int]:
    """The stand-in trainers' pids, once both have started."""

    def read() -> list[int] | None:
        files = [worker_home(i) / "trainer.json" for i in range(2)]
        if not all(f.is_file() for f in files):
            return None
        try:
            return [json.loads(f.read_text())["pid"] for f in files]
        except (json.JSONDecodeError, KeyError):
            return None

    return wait_until(read, 30, "both stand-in trainers")


def the_run(cluster: Path, cli) -> Path:  # type: ignore[no-untyped-def]
    bucket = Path(json.loads(cli("status", "-c", str(cluster), "--json").out)["bucket"])
    runs = sorted((bucket / "runs").iterdir())
    assert runs, "no run dir"
    return runs[-1]


def run_info(run: Path) -> dict[str, Any]:
    try:
        return json.loads((run / "run.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def ended(run: Path, timeout: float = 30) -> dict[str, Any]:
    return wait_until(
        lambda: run_info(run) if run_info(run).get("status") not in (None, "running") else None,
        timeout,
        f"run {run.name} to end",
    )


def test_a_trainer_that_cannot_start_is_reported_before_a_run_is_made(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    cluster, recipe, venv = built_venv(tmp_path, cli, None)

    result = cli("train", str(recipe), "-c", str(cluster))
    assert result.code == 1, result.err
    assert "Traceback" not in result.err
    assert f"worker 0: cannot start {venv / 'bin' / 'python'}: No such file or directory" in result.err
    bucket = Path(json.loads(cli("status", "-c", str(cluster), "--json").out)["bucket"])
    assert not (bucket / "runs").is_dir() or list((bucket / "runs").iterdir()) == []


def test_killing_the_controller_leaves_the_run_to_finish(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    cluster, recipe, _ = built_venv(tmp_path, cli)
    for i in range(2):
        script(i, seconds=3)
    proc = tpuft("train", str(recipe), "-c", str(cluster))
    pids = trainer_pids()
    proc.kill()  # kill -9: no clean-up of any kind
    proc.communicate(timeout=10)
    assert all(alive(pid) for pid in pids)
    info = ended(the_run(cluster, cli))
    assert info["status"] == "finished" and info["attempts"][0]["status"] == "finished"
    log = (the_run(cluster, cli) / "logs" / "worker-1.log").read_text()
    # TPUFT_WORKER_ID / NUM_WORKERS
    assert "stand-in trainer 1 of 2" in log and "trainer ended: finished" in log


def test_a_crash_stops_every_worker_without_a_controller(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    cluster, recipe, _ = built_venv(tmp_path, cli)
    script(0)  # trains "forever"
    script(1, seconds=1.5, exit=3)
    started = run_tpuft("train", str(recipe), "-c", str(cluster), "--detach", "--json")
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout)["detached"] is True
    pids = trainer_pids()
    run = the_run(cluster, cli)
    info = ended(run, timeout=30)
    assert info["status"] == "failed" and info["culprit"] == 1
    assert info["cause"] == "worker 1: exit code 3"
    assert "stand-in trainer 1 ends with exit code 3" in info["culprit_tail"]
    records = {i: json.loads((run / "attempts" / "1" / f"worker-{i}.json").read_text()) for i in range(2)}
    assert records[0]["status"] == "stopped" and records[0]["reason"] == "worker 1 failed"
    assert records[0]["ended"] - records[1]["ended"] < 10  # the healthy worker was stopped within 10 s
    wait_until(lambda: not any(alive(pid) for pid in pids), 5, "no trainer left")
    shown = cli("runs", "-c", str(cluster))
    assert "failed (worker 1)" in shown.out, shown.out


def test_a_hung_worker_is_named_and_the_run_stopped(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    recipe_text = (
        (Path(__file__).parent / "standin.py").read_text().split('RECIPE = """\\\n')[1].split('"""')[0]
    )
    cluster, recipe, _ = built_venv(
        tmp_path, cli, recipe=recipe_text.replace("batch_size: 2}", "batch_size: 2, hang_timeout: 2}")
    )
    script(0, wait_for_peer=True)  # blocks "in a collective" once worker 1 goes quiet, like gloo would
    script(1, wait_for_peer=True)
    assert run_tpuft("train", str(recipe), "-c", str(cluster), "--detach").returncode == 0
    pids = trainer_pids()
    time.sleep(0.5)
    os.kill(pids[1], signal.SIGSTOP)  # worker 1 hangs; worker 0 then waits for it
    info = ended(the_run(cluster, cli), timeout=60)
    assert info["status"] == "failed" and info["culprit"] == 1, info
    assert info["cause"].startswith("hung: worker 1 was stopped (SIGSTOP) for "), info["cause"]
    wait_until(lambda: not any(alive(pid) for pid in pids), 10, "no trainer left")
    snap = json.loads(cli("monitor", "-c", str(cluster), "--json").out)
    assert [w["status"] for w in snap["workers"]] == ["stopped", "hung"]


def test_ctrl_c_detaches_and_attach_stop_resume_take_over(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    cluster, recipe, _ = built_venv(tmp_path, cli)
    proc = tpuft("train", str(recipe), "-c", str(cluster))
    pids = trainer_pids()
    wait_until(
        lambda: any("step 10" in p.read_text() for p in (the_run(cluster, cli) / "logs").glob("*.log")),
        30,
        "step 10",
    )
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    run = the_run(cluster, cli)
    assert f"re-attach: tpuft attach {run.name}" in out and f"tpuft stop {run.name}" in out
    assert all(alive(pid) for pid in pids)  # a keystroke did not throw the run away

    # A second run on the busy cluster is refused, naming the live one.
    second = cli("train", str(recipe), "-c", str(cluster))
    assert second.code == 2 and f"run {run.name} is training on worker(s) 0, 1" in second.err
    assert f"tpuft stop {run.name}" in second.err
    # So is deleting the cluster.
    deleted = cli("delete", "-c", str(cluster), "--yes")
    assert deleted.code == 2 and f"run {run.name} is training" in deleted.err

    # attach shows the last lines, then follows; Ctrl-C detaches again.
    attached = tpuft("attach", "-c", str(cluster), "-n", "2")
    time.sleep(3)
    attached.send_signal(signal.SIGINT)
    out, err = attached.communicate(timeout=30)
    assert attached.returncode == 0, err
    assert "[w0] step" in out and "[w1] step" in out and "detached" in out
    assert all(alive(pid) for pid in pids)

    stopped = cli("stop", "-c", str(cluster), "--json")
    assert stopped.code == 0, stopped.err
    result = json.loads(stopped.out)
    assert result["status"] == "stopped" and sorted(result["trainer_pids"].values()) == sorted(pids)
    assert not any(alive(pid) for pid in pids)  # no trainer left on any worker
    assert run_info(run)["status"] == "stopped"

    for i in range(2):
        script(i, seconds=1)
    resumed = cli("resume", run.name[:12], "-c", str(cluster), "--json")
    assert resumed.code == 0, resumed.err
    assert json.loads(resumed.out)["attempt"] == 2
    info = run_info(run)
    assert info["status"] == "finished" and [a["status"] for a in info["attempts"]] == ["stopped", "finished"]
    # run.json's chips and pricing, as launched: both attempts priced, the local pod unbilled
    priced = run_cost(info)
    assert (info["pricing"], info["chips"]) == ("on-demand", chips_of(info["accelerator"]))
    assert [a["attempt"] for a in priced.per_attempt] == [1, 2] and not priced.billed and priced.total_usd > 0
    env = json.loads((worker_home(1) / "trainer.json").read_text())["env"]
    assert env["TPUFT_RESUME"] == "1" and env["TPUFT_ATTEMPT"] == "2" and env["TPUFT_RUN_ID"] == run.name
    again = cli("resume", run.name, "-c", str(cluster))
    assert again.code == 2 and "has finished" in again.err


def test_stop_on_interrupt_stops_the_run(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    cluster, recipe, _ = built_venv(tmp_path, cli)
    for i in range(2):
        script(i, ignore_term=i == 1)  # worker 1 needs the SIGKILL after the grace period
    proc = tpuft("train", str(recipe), "-c", str(cluster), "--stop-on-interrupt")
    pids = trainer_pids()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "stopped run" in err and "tpuft resume" in err
    assert not any(alive(pid) for pid in pids)
    info = run_info(the_run(cluster, cli))
    assert info["status"] == "stopped" and info["cause"] == "interrupted on the controller (Ctrl-C)"


def test_a_closed_terminal_detaches(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    cluster, recipe, _ = built_venv(tmp_path, cli)
    proc = tpuft("train", str(recipe), "-c", str(cluster), "--stop-on-interrupt")
    pids = trainer_pids()
    proc.send_signal(signal.SIGHUP)
    proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert all(alive(pid) for pid in pids) and run_info(the_run(cluster, cli))["status"] == "running"
    forced = cli("delete", "-c", str(cluster), "--yes", "--force")
    assert forced.code == 0, forced.err
    assert not any(alive(pid) for pid in pids)
    assert run_info(the_run(cluster, cli))["status"] == "stopped"


def test_leftovers_of_dead_runs_are_cleaned_before_a_run(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    cluster, recipe, _ = built_venv(tmp_path, cli)
    planted = []
    for i in range(2):
        home = worker_home(i)
        env = {**os.environ, "HOME": str(home), "TPUFT_RUN_ID": "old-run-20250101-000000-0001"}
        # A trainer that outlived its supervisor, in its own session like a real one.
        planted.append(subprocess.Popen(["sleep", "300"], env=env, start_new_session=True))
        state = home / ".tpuft" / "supervisor"
        state.mkdir(parents=True, exist_ok=True)
        (state / "current.json").write_text(
            json.dumps(
                {
                    "run_id": "old-run-20250101-000000-0001",
                    "status": "running",
                    "supervisor_pid": 999999,
                    "supervisor_ticks": 1,
                }
            )
        )
        script(i, seconds=0.5)
    result = cli("train", str(recipe), "-c", str(cluster))
    assert result.code == 0, result.err
    for proc in planted:
        assert proc.wait(timeout=5) == -signal.SIGKILL
    assert (
        f"cleaned worker 0: killed pid {planted[0].pid}, left over from run old-run-20250101-000000-0001"
        in result.out
    )
    assert "run old-run-20250101-000000-0001 had lost its supervisor (pid 999999)" in result.out


@pytest.mark.parametrize("since", ["10m", "2026-01-01T00:00:00"])
def test_since_accepts_durations_and_times(since: str) -> None:
    from tpuft.cli.training import _since_stamp

    stamp = _since_stamp(since)
    assert stamp is not None and stamp.endswith("Z") and len(stamp) == len("2026-01-01T00:00:00.000Z")


def test_peer_addresses_one_per_worker_distinct_ports_on_one_machine() -> None:
    """TF_CONFIG's workers: the port after the coordinator's on real hosts; free, distinct ports for loopback
    hosts (TF binds every interface, so two rig workers at 127.0.1.x on one port would clash)."""
    from tpuft.core.ports import COORDINATOR_PORT
    from tpuft.ops.trainer_env import peer_addresses

    assert peer_addresses(["10.0.0.1", "10.0.0.2"], f"10.0.0.1:{COORDINATOR_PORT}") == [
        f"10.0.0.1:{COORDINATOR_PORT + 1}",
        f"10.0.0.2:{COORDINATOR_PORT + 1}",
    ]
    local = peer_addresses(["127.0.1.10", "127.0.1.11", "127.0.0.1"], "127.0.1.10:8476")
    ports = [peer.rsplit(":", 1)[1] for peer in local]
    assert [peer.rsplit(":", 1)[0] for peer in local] == ["127.0.1.10", "127.0.1.11", "127.0.0.1"]
    assert len(set(ports)) == 3 and "8476" not in ports


@pytest.mark.slow
def test_a_worker_that_never_starts_is_reported_then_named_at_startup_timeout(
    tmp_path: Path, cli, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Start-up as one unit, on 2 slices of one worker: each trainer gets its slice's MEGASCALE variables;
    while slice 1's host sits in its rendezvous the live view says so; at train.startup_timeout slice 0's
    supervisor ends the run naming the host that never came (not itself, which only waited)."""
    recipe_text = (
        (Path(__file__).parent / "standin.py").read_text().split('RECIPE = """\\\n')[1].split('"""')[0]
    )
    cluster, recipe, _ = built_venv(
        tmp_path,
        cli,
        recipe=recipe_text.replace("batch_size: 2}", "batch_size: 2, startup_timeout: 3}"),
        slices=2,
    )
    script(0)
    script(1, start_after=3600)
    monkeypatch.setenv("TPUFT_STARTUP_REPORT_SECONDS", "1")
    result = run_tpuft("train", str(recipe), "-c", str(cluster), timeout=90)
    assert result.returncode == 1, result.stderr
    assert "waiting for slice 1 host 0 (worker 1) to start: 1 of 2 up, " in result.stdout, result.stdout
    assert "of train.startup_timeout (3 s)" in result.stdout
    envs = [json.loads((worker_home(i) / "trainer.json").read_text())["env"] for i in range(2)]
    port = envs[0]["TPUFT_MEGASCALE_PORT"]
    assert [e["MEGASCALE_SLICE_ID"] for e in envs] == ["0", "1"] and {
        e["MEGASCALE_NUM_SLICES"] for e in envs
    } == {"2"}
    assert {e["MEGASCALE_COORDINATOR_ADDRESS"] for e in envs} == {f"127.0.0.1:{port}"}
    assert port != envs[0]["TPUFT_COORDINATOR"].rsplit(":", 1)[1]
    info = run_info(the_run(cluster, cli))
    assert info["status"] == "failed" and info["culprit"] == 0 and info["startup_timeout"] == 3.0, info
    assert info["slices"] == 2 and info["placement"] == [{"slice": 0, "host": 0}, {"slice": 1, "host": 0}]
    assert info["cause"].startswith("hung: slice 0 host 0 (worker 0) waited "), info["cause"]
    assert info["cause"].endswith("s (train.startup_timeout 3 s) for slice 1 host 0 (worker 1) to start"), (
        info["cause"]
    )
    assert "last lines of slice 0 host 0 (worker 0):" in result.stderr
