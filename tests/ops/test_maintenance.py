"""Maintenance-aware runs and drills, piece by piece on the rigs (no training: the run dir is written by
hand).

The GCP provider reads the node's upcoming maintenance from the fake TPU API (v2alpha1), ``tpuft status``
shows it, the watcher's :class:`MaintenanceWatch` asks for the checkpoint-and-stop before a due window; each
supervisor's poll (:class:`MaintenanceNotices`) hears of it from the metadata server rig that follows the fake
API's simulated event, one request per window whoever hears first; ``tpuft drill`` does it on GCP (simulated
event, StopNode) and on the local pod (the notice file, SIGKILL). The trainers' answer to the request is the
checkpoint engineer's (tests/ops/test_ondemand.py); a whole run through a maintenance window, real trainers on
the GCP rigs, is tests/e2e/test_recovery_rigs.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.ops.standin import worker_home
from tests.providers.test_gcp_provider import cluster_yaml, fake_tpu  # noqa: F401 - the fixture
from tests.rigs.fake_tpu import FakeTpuServer
from tests.rigs.metadata_server import MetadataServer
from tpuft.cli.options import load_cluster_file
from tpuft.ops.maintenance import MaintenanceWatch, wait_out_window
from tpuft.providers import get_provider
from tpuft.readers.runs import Run
from tpuft.run import rundir
from tpuft.run.maintenance_window import Window, rfc3339
from tpuft.worker.context import WorkerContext
from tpuft.worker.supervisor.maintenance import MaintenanceNotices, ask_before, read_notice


def _run(tmp_path: Path, workers: int = 1) -> Run:
    run = Run.from_url(tmp_path / "runs" / "demo-20261126-120000-0001")
    run.storage.write_text(
        rundir.RUN_INFO,
        json.dumps({"status": "running", "attempt": 1, "workers": workers, "backend": "torch_xla"}),
    )
    run.storage.write_text(rundir.RECIPE, "name: demo\ntrain:\n  batch_size: 8\n")
    return run


def _live_run(cluster_file: Path, run_id: str = "demo-20261126-120000-0002") -> Run:
    """A run that trains on the cluster, as its run storage shows it (``gs://`` in the GCS emulator, or the
    local pod's folder): run.json running on this cluster, a fresh heartbeat. What a drill needs to drill."""
    from tpuft.readers.runs import run_at, run_storage

    config = load_cluster_file(cluster_file)
    run = run_at(run_storage(config), run_id, config.gcp.project)
    info = {
        "run_id": run_id,
        "cluster": config.name,
        "status": "running",
        "started": time.time(),
        "workers": 1,
    }
    run.storage.write_text(rundir.RUN_INFO, json.dumps(info))
    run.storage.write_text(f"{rundir.HEARTBEAT_DIR}/worker-0.json", json.dumps({"time": time.time()}))
    return run


def _requests(run: Run) -> list[dict[str, object]]:
    found = []
    for relpath in run.storage.list(f"{rundir.ATTEMPTS_DIR}/1"):
        if rundir.CHECKPOINT_REQUEST_NAME.match(relpath.rpartition("/")[2]):
            found.append(json.loads(run.storage.read_text(relpath) or "{}"))
    return found


def _events(run: Run) -> list[dict[str, object]]:
    return [json.loads(run.storage.read_text(p) or "{}") for p in run.storage.list(rundir.CONTROLLER_EVENTS)]


def test_status_shows_the_api_s_maintenance_and_the_watcher_asks_before_it(  # type: ignore[no-untyped-def]
    cli,
    tmp_path: Path,
    fake_tpu: FakeTpuServer,  # noqa: F811
) -> None:
    path = cluster_yaml(tmp_path, fake_tpu)
    assert cli("create", "-c", str(path), "--yes").code == 0
    assert "maintenance" not in json.loads(cli("status", "-c", str(path), "--json").out)["details"]
    # two hours ahead: shown, not acted on
    window = fake_tpu.announce_maintenance("tp", starts_in=7200, lasts=600)
    shown = json.loads(cli("status", "-c", str(path), "--json").out)["details"]["maintenance"]
    assert shown == f"SCHEDULED PENDING {window['windowStartTime']} .. {window['windowEndTime']}"
    assert f"maintenance: {shown}" in cli("status", "-c", str(path)).out

    run = _run(tmp_path)
    notices: list[str] = []
    watch = MaintenanceWatch(run, notices.append)
    provider = get_provider(load_cluster_file(path))
    assert watch.see(provider.get()) is None and _requests(run) == []
    fake_tpu.announce_maintenance("tp", starts_in=120, lasts=600)
    asked = watch.see(provider.get())
    assert asked is not None and "resumes after the window" in notices[-1]
    [request] = _requests(run)
    assert request["stop"] is True and str(request["reason"]).startswith("maintenance window at ")
    [event] = _events(run)
    assert event["kind"] == "maintenance" and event["request"] == asked and "TPU API" in str(event["source"])
    assert watch.see(provider.get()) is None and len(_requests(run)) == 1  # once per window

    fake_tpu.deny("v2alpha1.GetNode")  # a refused v2alpha1 call costs the line, not the status
    denied = json.loads(cli("status", "-c", str(path), "--json").out)
    assert denied["state"] == "READY" and denied["details"]["maintenance"].startswith("unknown (")


def test_supervisors_hear_the_simulated_event_and_ask_once(  # type: ignore[no-untyped-def]
    cli,
    tmp_path: Path,
    fake_tpu: FakeTpuServer,  # noqa: F811 - the fixture imported above
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Worker 1's metadata server announces the window (the drill's simulated event); its supervisor's poll
    writes the request within a poll; worker 0's, told of the same window later, finds it asked. Measured: the
    seconds from the drill's answer to the request in the run dir at a 0.05 s poll."""
    path = cluster_yaml(tmp_path, fake_tpu)
    assert cli("create", "-c", str(path), "--yes").code == 0
    run = _run(tmp_path, workers=2)
    beat = {"step": 40, "time": time.time(), "examples_per_s": 80.0}  # 10 steps/s at batch 8
    rundir.heartbeat_path(Path(run.url), 1).parent.mkdir(parents=True, exist_ok=True)
    rundir.heartbeat_path(Path(run.url), 1).write_text(json.dumps(beat))
    with MetadataServer(workers=2) as meta:
        meta.follow(fake_tpu, ["tp"], hosts_per_node=2)
        said: list[str] = []
        contexts = [
            WorkerContext("demo", Path(run.url), w, 2, "127.0.0.1:1", run_url=run.url) for w in (0, 1)
        ]
        monkeypatch.setenv("GCE_METADATA_HOST", meta.host(1))
        worker1 = MaintenanceNotices(
            contexts[1], run.storage, 1, said.append, home=tmp_path / "no-home", poll=0.05
        )
        thread = __import__("threading").Thread(target=worker1.loop, daemon=True)
        thread.start()
        _live_run(path)
        drilled = cli("drill", "maintenance", "--worker", "1", "-c", str(path), "--json", "--yes")
        answered = time.time()
        assert drilled.code == 0, drilled.err
        assert json.loads(drilled.out)["action"].startswith("SimulateMaintenanceEvent")
        assert [c.body for c in fake_tpu.calls("SimulateMaintenanceEvent")] == [{"workerIds": ["1"]}]
        # within a poll: 0.05 s here, bounded at 5 s for a loaded machine (the default poll is 10 s)
        while not _requests(run) and time.time() - answered < 5:
            time.sleep(0.01)
        latency = time.time() - answered
        worker1.stopped.set()
        [request] = _requests(run)
        assert (
            request["stop"] is True
            and isinstance(request["at_step"], int)
            and int(request["at_step"]) >= 40 + 60
        )
        assert "checkpoint" in said[-1] and latency < 5
        print(f"announcement -> request in the run dir: {latency:.3f} s (poll 0.05 s)")
        # A refused request (a host had passed its step) does not stand: the next poll asks again, with no
        # second maintenance event; the poll after that finds the new one standing.
        run.storage.write_text(
            f"{rundir.ATTEMPTS_DIR}/1/checkpoint-{request['id']}-worker-1.json",
            json.dumps({"step": 200, "refused": "worker 1 was at step 200 ...", "time": time.time()}),
        )
        time.sleep(0.002)
        again = worker1.check()
        assert again is not None and again != request["id"] and worker1.check() is None, said[-3:]
        assert [e["kind"] for e in _events(run)] == ["maintenance"]

        monkeypatch.setenv("GCE_METADATA_HOST", meta.host(0))
        meta.announce(0, meta._upcoming[1])  # the same window reaches worker 0 too
        worker0 = MaintenanceNotices(
            contexts[0], run.storage, 1, said.append, home=tmp_path / "no-home", poll=0.05
        )
        assert worker0.check() is None and "asked for already" in said[-1] and len(_requests(run)) == 2
        meta.clear(0)
        assert read_notice(tmp_path / "no-home")[0] is None
        meta.begin(0)  # GCE's 60 s warning: maintenance-event changes, no window announced
        event, source = read_notice(tmp_path / "no-home")
        assert event == {"type": "TERMINATE_ON_HOST_MAINTENANCE", "maintenance_status": "PENDING"}
        assert source.endswith("(maintenance-event)") and Window.of(event).due(time.time())


def test_drill_preempt_stops_the_node_and_refusals_are_usage_errors(  # type: ignore[no-untyped-def]
    cli,
    tmp_path: Path,
    fake_tpu: FakeTpuServer,  # noqa: F811
) -> None:
    path = cluster_yaml(tmp_path, fake_tpu)
    # a bucket of its own: the module's GCS emulator holds another test's live run in the default one
    path.write_text(path.read_text() + "bucket: gs://tpuft-drill-refusals\n")
    assert cli("create", "-c", str(path), "--yes").code == 0
    wrong = cli("drill", "maintenance", "--worker", "5", "-c", str(path))
    assert wrong.code == 2 and "has workers 0..1" in wrong.err
    assert cli("drill", "reboot", "-c", str(path)).code == 2
    # no run on the node: nothing to drill, confirmed or not, and the TPU API is not asked to do anything
    for kind in ("maintenance", "preempt"):
        for confirmed in ([], ["--yes"]):
            idle = cli("drill", kind, "-c", str(path), *confirmed)
            assert idle.code == 2 and "no run is training on cluster tp" in idle.err, idle.err
            assert "gs://tpuft-drill-refusals" in idle.err and "nothing was done" in idle.err
    assert fake_tpu.calls("SimulateMaintenanceEvent") == [] and fake_tpu.calls("StopNode") == []
    run = _live_run(path)
    # a run trains there: asked as delete asks; nobody to answer (not a terminal) and no --yes is a refusal
    unconfirmed = cli("drill", "preempt", "-c", str(path))
    assert unconfirmed.code == 2 and "pass --yes to confirm" in unconfirmed.err, unconfirmed.err
    assert f"run {run.id}: stop TPU node tp: every worker of it" in unconfirmed.err
    unconfirmed = cli("drill", "maintenance", "--worker", "1", "-c", str(path), "--json")
    assert unconfirmed.code == 2 and "pass --yes" in json.loads(unconfirmed.out)["error"]
    assert fake_tpu.calls("StopNode") == [] and fake_tpu.node("tp")["state"] == "READY"  # type: ignore[index]
    stopped = cli("drill", "preempt", "--worker", "0", "-c", str(path), "--yes")
    assert stopped.code == 0 and "StopNode" in stopped.out and "no preemption simulation" in stopped.out
    assert fake_tpu.node("tp")["state"] == "STOPPED"  # type: ignore[index]
    again = cli("drill", "preempt", "-c", str(path), "--yes")
    assert again.code == 2 and "is STOPPED, not READY" in again.err


def test_local_drill_writes_the_notice_the_supervisor_and_status_read(  # type: ignore[no-untyped-def]
    cli, cluster_file: Path
) -> None:
    assert cli("create", "-c", str(cluster_file)).code == 0
    idle = cli("drill", "maintenance", "--worker", "1", "-c", str(cluster_file), "--yes")
    assert idle.code == 2 and "no run is training on cluster" in idle.err, idle.err  # nothing to drill
    assert read_notice(worker_home(1, "test-pod"))[0] is None  # and no window was written
    _live_run(cluster_file)
    # the local pod's drills touch only its own folders: not asked about (no --yes, no terminal)
    drilled = cli(
        "drill", "maintenance", "--worker", "1", "--notice", "30", "-c", str(cluster_file), "--json"
    )
    assert drilled.code == 0, drilled.err
    notice = Path(json.loads(drilled.out)["detail"]["path"])
    home = notice.parents[1]
    window, source = read_notice(home)
    assert window is not None and source.startswith("file ") and Window.of(window).due(time.time())
    status = json.loads(cli("status", "-c", str(cluster_file), "--json").out)
    assert status["details"]["maintenance worker 1"].startswith("UNSCHEDULED PENDING")
    nothing = cli("drill", "preempt", "--worker", "1", "-c", str(cluster_file))
    assert nothing.code == 2 and "runs nothing to preempt" in nothing.err


def test_a_run_stopped_for_maintenance_waits_out_the_window(tmp_path: Path) -> None:
    run = _run(tmp_path)
    now = time.time()
    end = float(int(now) + 1)  # the reason names whole seconds: the wait ends within a second or so
    window = Window("SCHEDULED", "PENDING", now - 1, end)
    asked = ask_before(run.storage, 1, window, source="test", at_step=None, now=now)
    assert asked is not None and ask_before(run.storage, 1, window, source="test", at_step=None) is None
    renewed: list[float] = []
    said: list[str] = []
    info = {"status": "stopped", "cause": window.reason(), "attempt": 1}
    assert wait_out_window(info, said.append, lambda: renewed.append(time.time()), poll=0.05, run=run)
    # no trainer answered: said nothing
    assert time.time() >= end and renewed and f"ends at {rfc3339(end)}" in said[0]
    assert not wait_out_window(
        {"status": "stopped", "cause": "stopped by the user"}, said.append, lambda: None, 1.0
    )
    assert not Window("SCHEDULED", "PENDING", now - 10, now - 1).due(now)  # over: not asked for again


def test_the_checkpoint_before_the_window_is_read_back_printed_and_in_the_goodput(tmp_path: Path) -> None:
    """The trainers' side written by hand as they write it (the chief's answer with its save time, the
    checkpoint's manifest, the chief supervisor's final record after its upload): the latencies and the margin
    before the window, the line the watcher prints, the ``checkpoint_ask`` event (once, however often it is
    read back) and goodput's ``maintenance`` entry; a late checkpoint is said to be late."""
    from tests.ops.test_ondemand import _save
    from tpuft.ops.maintenance import checkpoint_before, describe_checkpoint
    from tpuft.run.goodput import breakdown

    run = _run(tmp_path)
    asked = time.time() - 100.0
    window = Window("SCHEDULED", "PENDING", float(int(asked) + 30), float(int(asked) + 60))
    request_id = ask_before(run.storage, 1, window, source="TPU API", at_step=None, now=asked)
    info = {"status": "stopped", "cause": window.reason(), "attempt": 1}
    assert request_id is not None and checkpoint_before(run, info, window) is None  # not answered yet
    run.storage.write_text(
        f"{rundir.ATTEMPTS_DIR}/1/checkpoint-{request_id}-worker-0.json",
        json.dumps({"step": 60, "saved": asked + 4.0}),
    )
    _save(run, 60)
    run.storage.write_text(rundir.attempt_record(1, 0), json.dumps({"final": True, "alive": asked + 9.5}))
    found = checkpoint_before(run, info, window)
    assert found is not None and found["step"] == 60 and found["in_storage"]
    assert (found["saved_s"], found["stored_s"]) == (4.0, 9.5) and found["before_window_s"] == pytest.approx(
        window.start - asked - 9.5, abs=0.1
    )
    line = describe_checkpoint(found)
    assert line.startswith(
        "checkpoint before maintenance: step 60, saved 4.0 s after the ask, in run storage 9.5 s"
    )
    assert "before the window" in line and "AFTER" not in line
    assert checkpoint_before(run, info, window) is not None
    asks = [e for e in _events(run) if e["kind"] == "checkpoint_ask"]
    assert len(asks) == 1 and asks[0]["latency_s"] == 9.5 and asks[0]["step"] == 60, asks
    (entry,) = breakdown(
        run.storage, {"status": "stopped", "created": asked - 5, "ended": asked + 20}
    ).maintenance
    assert (
        entry["step"] == 60
        and entry["latency_s"] == entry["after_notice_s"] == 9.5
        and entry["source"] == "TPU API"
    ), entry
    late = describe_checkpoint({**found, "before_window_s": -3.0})
    assert "3.0 s AFTER the window began (the notice came too late)" in late


def test_a_refused_checkpoint_before_maintenance_is_asked_again_past_the_refusal(tmp_path: Path) -> None:
    """Seen on the GCP rigs: an early heartbeat's speed (its window held the compilation) named a step the
    chief had passed, the chief refused, and the notice was dropped. Now the refused request does not stand:
    the watcher asks again at its next poll, past the refusal's step at the speed the two points give, with no
    second event."""
    run = _run(tmp_path, workers=2)
    now = time.time()
    # 0.5 steps/s by the heartbeat: far too slow
    run.storage.write_text(
        f"{rundir.HEARTBEAT_DIR}/worker-0.json",
        json.dumps({"step": 10, "time": now - 20.0, "examples_per_s": 4.0}),
    )
    window = Window("SCHEDULED", "PENDING", now + 60, now + 70)
    notices: list[str] = []
    watch = MaintenanceWatch(run, notices.append)
    first = watch.ask(window, source="TPU API", now=now)
    # it stands: not asked twice
    assert first is not None and watch.ask(window, source="TPU API", now=now) is None
    # 40 steps in 20 s: 2 steps/s
    run.storage.write_text(
        f"{rundir.ATTEMPTS_DIR}/1/checkpoint-{first}-worker-0.json",
        json.dumps({"step": 50, "refused": "worker 0 was at step 50 ...", "time": now}),
    )
    time.sleep(0.002)  # another millisecond: another request id
    again = watch.ask(window, source="TPU API", now=time.time())
    assert again is not None and again != first and "asked again" in notices[-1]
    (standing,) = [r for r in _requests(run) if r["id"] == again]
    # past the refusal, at the measured speed over the relay's 3 s slack
    assert int(standing["at_step"]) >= 50 + 2 * 3
    assert [e["kind"] for e in _events(run)] == ["maintenance"]


def test_a_supervisor_asks_for_the_checkpoint_of_its_workers_notice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor proper (in process, a ``sleep`` for a trainer): the one line in supervision.py starts
    the poll, and a notice file in the worker's home (the local pod's metadata key) becomes the request and a
    line in its log."""
    from tpuft.worker.supervisor import maintenance
    from tpuft.worker.supervisor.supervision import Supervisor

    home = tmp_path / "home"
    (home / ".tpuft").mkdir(parents=True)
    start = time.time() + 30
    (home / ".tpuft" / "upcoming-maintenance.json").write_text(
        json.dumps(
            {
                "type": "SCHEDULED",
                "maintenance_status": "PENDING",
                "window_start_time": rfc3339(start),
                "window_end_time": rfc3339(start + 60),
            }
        )
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("GCE_METADATA_HOST", raising=False)
    monkeypatch.setattr(maintenance, "POLL_SECONDS", 0.05)
    run = _run(tmp_path)
    ctx = WorkerContext("demo", Path(run.url), 0, 1, "127.0.0.1:1", run_url=run.url)
    code = Supervisor(ctx, ["bash", "-c", "sleep 0.6"], 1, 60.0, run.storage).run()
    assert code == 0
    [request] = _requests(run)
    assert (
        request["stop"] is True
        and request["at_step"] is None
        and "maintenance window at" in str(request["reason"])
    )
    assert "maintenance announced (file " in (
        run.storage.read_text(rundir.log_path(Path("."), 0).as_posix()) or ""
    )


def test_the_watcher_resumes_a_run_stopped_for_maintenance_once_the_window_is_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """watch()'s loop: a run ``stopped`` with the window as its cause is waited out and resumed (a run stopped
    for anything else is not: tests/ops/test_recover.py). The attach and the node's answer are replaced
    here."""
    import tpuft.ops.recover as recover_module
    from tpuft.config import ClusterConfig
    from tpuft.ops.recover import Callbacks, watch

    run = _run(tmp_path)
    end = float(int(time.time()) + 1)
    cause = Window("SCHEDULED", "PENDING", end - 60, end).reason()
    states = iter(["stopped", "stopped", "finished"])
    launch = {"hosts": [0], "python": "py", "package": "pkg"}
    monkeypatch.setattr(recover_module, "resolve_run", lambda config, run_id: run)
    monkeypatch.setattr(
        recover_module,
        "finalize",
        lambda run: {
            "run_id": "r-1",
            "status": next(states),
            "cause": cause,
            "backend": "torch_xla",
            "launch": launch,
        },
    )
    monkeypatch.setattr(recover_module, "node_problem", lambda config, info: None)
    resumed: list[float] = []
    monkeypatch.setattr(recover_module, "resume", lambda config, run_id, **kw: resumed.append(time.time()))
    monkeypatch.setattr(recover_module, "finished_result", lambda run, info, backend, hosts: info["status"])
    notices: list[str] = []
    config = ClusterConfig.model_validate({"name": "rc"})
    assert watch(config, "r-1", Callbacks(on_notice=notices.append)) == "finished"
    assert len(resumed) == 1 and resumed[0] >= end
    assert any("resumes after the window ends at" in n for n in notices)
