"""The recovery watcher's parts that need no training: the cluster file's ``recover``, the question it asks
the (fake) TPU API about a run's node, and the lease that keeps two watchers from recreating one node. The
whole loop, preemption to finished run, is tests/e2e/test_recovery_rigs.py."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tpuft.providers.gcp.tuning as gcp_module
from tests.rigs.fake_tpu import FakeTpuServer
from tests.rigs.gcs_emulator import GcsEmulator
from tpuft.backends.spec import manifest_text
from tpuft.config import ClusterConfig, load_cluster
from tpuft.core.errors import UsageError
from tpuft.ops.recover import node_problem
from tpuft.ops.watcher_lease import WATCHER, WatchTakenOver, watcher_lease
from tpuft.providers import get_provider
from tpuft.readers.runs import Run
from tpuft.run import goodput, rundir


def test_recover_in_the_cluster_file(tmp_path: Path) -> None:
    assert ClusterConfig.model_validate({}).recover.enabled is False
    on = ClusterConfig.model_validate({"recover": True}).recover
    assert on.enabled and on.max_attempts == 10 and on.backoff == 30.0
    tuned = ClusterConfig.model_validate(
        {"recover": {"max_attempts": 2, "backoff": "1m", "poll": "5s"}}
    ).recover
    assert tuned.enabled and (tuned.max_attempts, tuned.backoff, tuned.poll) == (2, 60.0, 5.0)
    assert (
        ClusterConfig.model_validate({"recover": {"enabled": False, "max_attempts": 3}}).recover.enabled
        is False
    )

    bad = tmp_path / "tpuft.yaml"
    bad.write_text("name: c\nrecover:\n  max_attempts: 0\n  backof: 10s\n")
    with pytest.raises(Exception) as caught:
        load_cluster(bad)
    text = str(getattr(caught.value, "message", caught.value))
    assert "tpuft.yaml:3" in text and "recover.max_attempts" in text
    assert "tpuft.yaml:4" in text and "recover.backof" in text


@pytest.fixture
def fake_gcp(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[tuple[FakeTpuServer, ClusterConfig]]:
    monkeypatch.setattr(gcp_module, "POLL_SECONDS", 0.01)
    monkeypatch.setenv("TPUFT_HOME", str(tmp_path / "home"))
    with GcsEmulator() as gcs, FakeTpuServer(operation_polls=1) as tpu:
        for key, value in gcs.env().items():
            monkeypatch.setenv(key, value)
        config = ClusterConfig.model_validate(
            {
                "name": "rc",
                "provider": "gcp",
                "accelerator": "v4-16",
                "gcp": {"project": "tpuft-test", "zone": "us-central2-b", "tpu_api_endpoint": tpu.endpoint},
            }
        )
        yield tpu, config


def test_node_problem_names_what_the_api_says(fake_gcp: tuple[FakeTpuServer, ClusterConfig]) -> None:
    tpu, config = fake_gcp
    cluster, _ = get_provider(config).create()
    info = {"launch": {"hosts": [0, 1]}, "addresses": [w.address for w in cluster.workers]}
    assert node_problem(config, info) is None
    assert (
        node_problem(config, {**info, "addresses": ["10.0.0.1", "10.0.0.2"]})
        == "the workers came back with new addresses"
    )
    tpu.preempt("rc")
    assert node_problem(config, info) == "node PREEMPTED"
    get_provider(config).delete()
    assert node_problem(config, info) == "node NOT_FOUND"


def _run(tmp_path: Path) -> Run:
    folder = tmp_path / "runs" / "r-1"
    folder.mkdir(parents=True)
    return Run.from_url(folder)


def test_a_live_watcher_keeps_its_run_and_a_dead_or_silent_one_is_taken_over(tmp_path: Path) -> None:
    policy = ClusterConfig.model_validate({"recover": {"poll": "2s"}}).recover
    run = _run(tmp_path)
    with watcher_lease(run, policy) as renew:
        held = json.loads((run.storage.local_root / WATCHER).read_text())  # type: ignore[operator]
        assert held["pid"] == os.getpid() and held["host"] == socket.gethostname()
        renew()
    assert json.loads(run.storage.read_text(WATCHER) or "{}")["ended"]  # let go: the next one needs no wait

    elsewhere = {"host": "laptop.example", "pid": 4242, "seen": time.time()}
    run.storage.write_text(WATCHER, json.dumps(elsewhere))
    with pytest.raises(UsageError) as refused:
        with watcher_lease(run, policy):
            pass
    assert "pid 4242 on laptop.example" in refused.value.message and "--recover" in (refused.value.hint or "")

    run.storage.write_text(WATCHER, json.dumps({**elsewhere, "seen": time.time() - 3600}))  # the laptop slept
    with watcher_lease(run, policy):
        assert json.loads(run.storage.read_text(WATCHER) or "{}")["pid"] == os.getpid()

    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    run.storage.write_text(
        WATCHER, json.dumps({"host": socket.gethostname(), "pid": dead, "seen": time.time()})
    )
    with watcher_lease(run, policy):  # killed on this machine a moment ago: no need to wait
        pass


@pytest.fixture(params=["local", "gcs"])
def lease_run(request: pytest.FixtureRequest, tmp_path: Path) -> Run:
    """A run dir in a folder, or in a bucket on the GCS emulator (whose uploads honour ifGenerationMatch)."""
    if request.param == "local":
        return _run(tmp_path)
    emulator = request.getfixturevalue("gcs")
    emulator.reset()
    emulator.client().create_bucket("lease-bucket")
    return Run.from_url("gs://lease-bucket/runs/r-1")


def test_a_watcher_whose_lease_was_taken_over_stops_and_leaves_it(lease_run: Run) -> None:
    """The laptop slept past the stale time and another machine took the run over: when the first watcher
    wakes, its next renewal raises (before it could touch the node again) and its exit does not undo the
    takeover."""
    policy = ClusterConfig.model_validate({"recover": {"poll": "2s"}}).recover
    other = {"host": "workstation.example", "pid": 777, "seen": time.time()}
    with pytest.raises(WatchTakenOver) as taken:
        with watcher_lease(lease_run, policy) as renew:
            renew()
            # the takeover, as the other machine writes it
            lease_run.storage.write_text(WATCHER, json.dumps(other))
            renew()
    assert "pid 777 on workstation.example" in taken.value.message
    assert json.loads(lease_run.storage.read_text(WATCHER) or "{}") == other  # still theirs


def test_two_watchers_claiming_at_the_same_moment_cannot_both_win(lease_run: Run) -> None:
    """Both read "nobody watches"; the other one's claim lands between this one's read and write: refused."""
    policy = ClusterConfig.model_validate({"recover": {"poll": "2s"}}).recover
    storage = lease_run.storage
    real_read = storage.read_versioned
    other = {"host": "workstation.example", "pid": 777, "seen": time.time()}

    def read_then_lose_the_race(relpath: str) -> tuple[str | None, str]:
        seen = real_read(relpath)
        storage.write_text(relpath, json.dumps(other))  # the other watcher's claim, just after our read
        object.__setattr__(storage, "read_versioned", real_read)  # (once)
        return seen

    object.__setattr__(storage, "read_versioned", read_then_lose_the_race)
    with pytest.raises(UsageError) as refused:
        with watcher_lease(lease_run, policy):
            pass
    assert "at the same moment" in refused.value.message and "pid 777" in refused.value.message
    assert json.loads(storage.read_text(WATCHER) or "{}") == other


def test_a_detached_watcher_outlives_its_terminal_and_logs_to_the_state_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--detach --recover`` starts ``tpuft resume RUN --recover`` in a session of its own, output to a
    log."""
    from tpuft.cli.watching import spawn_watcher

    monkeypatch.setenv("TPUFT_HOME", str(tmp_path / "home"))
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(f"name: w\nprovider: local\nbucket: {tmp_path / 'bucket'}\n")
    pid, log = spawn_watcher("no-such-run", cluster)
    assert log == tmp_path / "home" / "watchers" / "no-such-run.log"
    assert os.getsid(pid) == pid  # its own session: a closed terminal's SIGHUP does not reach it
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "error" not in log.read_text():
        time.sleep(0.1)
    assert "error: no runs in" in log.read_text()  # what the watcher would have said on a terminal


def test_a_stockout_while_recreating_is_tried_again_after_a_longer_back_off(
    fake_gcp: tuple[FakeTpuServer, ClusterConfig],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The recreate half of a recovery on the fake API. ``setup`` and ``resume`` are replaced by recorders
    here: they need the sshd pod and a trainer, and the whole path runs in tests/e2e/test_recovery_rigs.py."""
    import tpuft.ops.recover as recover_module
    from tpuft.core.errors import TpuftError
    from tpuft.ops.recover import Callbacks, _recover

    tpu, config = fake_gcp
    cluster, _ = get_provider(config).create()
    run = _run(tmp_path)
    run.storage.write_text(
        "recipe.yaml", (Path(__file__).parents[2] / "tpuft" / "recipes" / "quickstart.yaml").read_text()
    )
    run.storage.write_text(
        "run.json",
        json.dumps(
            {
                "run_id": "r-1",
                "status": "running",
                "attempt": 1,
                "backend": "torch_xla",
                "total_steps": 100,
                "launch": {"hosts": [0, 1], "python": "py", "package": "pkg"},
                "addresses": [w.address for w in cluster.workers],
            }
        ),
    )
    done: list[object] = []
    monkeypatch.setattr(
        recover_module, "setup", lambda config, recipe, on_line=None: done.append(("setup", recipe.name))
    )
    monkeypatch.setattr(
        recover_module,
        "resume",
        lambda config, run_id, **kw: done.append(("resume", kw["recovery"]["cause"])),
    )
    policy = config.recover.model_copy(update={"max_attempts": 2, "backoff": 1.0, "poll": 1.0})
    slept: list[float] = []
    notices: list[str] = []

    # The bucket's heartbeat says step 70, its newest complete checkpoint is step 100 (a sync round uploads
    # checkpoints/ before heartbeat/ and the node died in between): the run reached at least 100.
    from tpuft.backends.torch_xla import LAYOUT

    folder = tmp_path / "runs" / "r-1"
    checkpoint = LAYOUT.checkpoint_dir(folder, 100)
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"w")
    LAYOUT.write_manifest(checkpoint)
    (folder / "heartbeat").mkdir()
    (folder / "heartbeat" / "worker-0.json").write_text(
        json.dumps({"step": 70, "status": "running", "time": time.time()})
    )

    tpu.preempt("rc")
    tpu.fail_next_create()  # the zone has no capacity right now
    _recover(
        config,
        run,
        run.info(),
        "node PREEMPTED",
        Callbacks(on_notice=notices.append),
        policy,
        slept.append,
        lambda: None,
    )
    (first,) = run.info()["recoveries"]
    assert "no more capacity" in first["error"] and done == [] and slept == [1.0]
    assert first["last_step"] == first["checkpoint_step"] == 100
    assert any("could not recreate rc now" in n for n in notices)
    assert node_problem(config, run.info()) == "node NOT_FOUND"

    _recover(config, run, run.info(), "node NOT_FOUND", Callbacks(), policy, slept.append, lambda: None)
    # 2 s, in polls
    assert slept == [1.0, 1.0, 1.0] and done == [
        ("setup", "quickstart"),
        ("resume", "node NOT_FOUND"),
    ]
    assert get_provider(config).get().state == "READY" and len(tpu.calls("CreateNode")) == 3

    run.storage.write_text("run.json", json.dumps({**run.info(), "recoveries": [first, first]}))
    with pytest.raises(TpuftError) as used_up:
        _recover(config, run, run.info(), "node PREEMPTED", Callbacks(), policy, slept.append, lambda: None)
    assert "recover.max_attempts (2) recoveries are used up" in used_up.value.message
    assert "tpuft resume r-1 --recover" in (used_up.value.hint or "")


def test_a_lost_slice_stops_the_others_and_recreates_the_whole_queued_resource(
    fake_gcp: tuple[FakeTpuServer, ClusterConfig],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Multislice: one preempted slice is the loss of the whole run. The cause names that slice; the trainers
    of the slice still up are stopped at once (here: the signal recorded; the sshd path runs in
    tests/e2e/test_recovery_rigs.py), the queued resource is deleted and created again with every slice, then
    set up and resumed (recorders here too)."""
    import tpuft.ops.recover as recover_module
    from tpuft.ops.recover import Callbacks, _recover

    tpu, single = fake_gcp
    config = ClusterConfig.model_validate(
        {
            **single.model_dump(exclude_unset=True),
            "gcp": {**single.gcp.model_dump(exclude_unset=True), "queued": True, "spot": True, "slices": 2},
        }
    )
    cluster, _ = get_provider(config).create()
    assert [w.slice for w in cluster.workers] == [0, 0, 1, 1]
    run = _run(tmp_path)
    run.storage.write_text(
        "recipe.yaml", (Path(__file__).parents[2] / "tpuft" / "recipes" / "quickstart.yaml").read_text()
    )
    info = {
        "run_id": "r-1",
        "status": "running",
        "attempt": 1,
        "backend": "torch_xla",
        "total_steps": 100,
        "launch": {"hosts": [0, 1, 2, 3], "python": "py", "package": "pkg"},
        "addresses": [w.address for w in cluster.workers],
    }
    run.storage.write_text("run.json", json.dumps(info))
    signalled: list[tuple[int, ...]] = []
    done: list[object] = []
    records: list[dict] = []

    def survivors_stop(session: object, run: Run, launch: object) -> None:
        """The stopped survivors' last sync round uploads a checkpoint the bucket did not have yet, then each
        records its end: the recovery must resume from (and record) that one, not what the bucket held at
        detection."""
        signalled.append(launch.hosts)  # type: ignore[attr-defined]
        weights = tmp_path / "runs" / "r-1" / "checkpoints" / "step_00000200"
        weights.mkdir(parents=True)
        (weights / "model.safetensors").write_bytes(b"w" * 8)
        (weights / "manifest.json").write_text(manifest_text({"model.safetensors": 8}))
        for host in launch.hosts:  # type: ignore[attr-defined]
            run.storage.write_text(
                f"attempts/1/worker-{host}.json", json.dumps({"status": "stopped", "final": True})
            )

    monkeypatch.setattr(recover_module, "signal_supervisors", survivors_stop)
    monkeypatch.setattr(recover_module, "setup", lambda config, recipe, on_line=None: done.append("setup"))
    monkeypatch.setattr(
        recover_module,
        "resume",
        lambda config, run_id, **kw: (done.append(kw["recovery"]["cause"]), records.append(kw["recovery"])),
    )
    assert node_problem(config, info) is None

    tpu.preempt("rc-1")
    problem = node_problem(config, info)
    assert problem == "node rc-1 (slice 1) PREEMPTED"
    # the recreate waits for capacity
    tpu.queued_states = (
        "ACCEPTED",
        "WAITING_FOR_RESOURCES",
        "PROVISIONING",
        "ACTIVE",
    )
    tpu.queued_gets_per_state = 3
    notices: list[str] = []
    policy = config.recover.model_copy(update={"backoff": 0.0})
    _recover(
        config, run, info, problem, Callbacks(on_notice=notices.append), policy, lambda s: None, lambda: None
    )
    assert signalled == [(0, 1)]  # slice 0's hosts, not the lost slice's
    assert "slice 0 host 0 (worker 0), slice 0 host 1 (worker 1)" in "\n".join(notices)
    assert "the whole run restarts" in (run.storage.read_text(rundir.stop_request(1)) or "")
    assert [c.query.get("force") for c in tpu.calls("DeleteQueuedResource")] == ["true"]
    assert len(tpu.calls("CreateQueuedResource")) == 2 and done == ["setup", problem]
    assert records[0]["checkpoint_step"] == 200 and records[0]["steps_lost"] == 0, records
    assert "resumes from the checkpoint at step 200" in "\n".join(notices)
    again = get_provider(config).get()
    assert again.state == "READY" and again.details["slice 1"] == "rc-1 READY" and len(again.workers) == 4
    # goodput: the new attempt's re-provisioning, and inside it the recreated queued resource's wait for
    # capacity
    recorded = {e["kind"]: e for e in goodput.read_events(run.storage) if e["attempt"] == 2}
    waited, made = recorded["queue_wait"], recorded["provision"]
    assert 0.02 < waited["s"] < made["s"], recorded  # ACCEPTED and WAITING_FOR_RESOURCES, 3 polls each
    assert made["t"] <= waited["t"] and waited["t"] + waited["s"] <= made["t"] + made["s"] + 0.002, recorded
    assert goodput.breakdown_of(list(recorded.values()), {}).badput["queue_wait"] == pytest.approx(
        waited["s"], abs=0.002
    )


def test_workers_that_die_under_the_followers_are_explained_by_the_node_state(
    fake_gcp: tuple[FakeTpuServer, ClusterConfig],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The followers may see the VMs die (their supervisors end) before the watch asks the API: the cause is
    then the node's state, which decides whether the recovery recreates the node. ``attach`` is replaced by
    its outcome here (the race needs a dying sshd pod; the whole path runs in
    tests/e2e/test_recovery_rigs.py)."""
    import tpuft.ops.recover as recover_module
    from tpuft.ops.lifecycle import AttachOutcome, Launch
    from tpuft.ops.recover import Callbacks, _attach_and_watch

    tpu, config = fake_gcp
    cluster, _ = get_provider(config).create()
    run = _run(tmp_path)
    info = {
        "run_id": "r-1",
        "status": "running",
        "attempt": 1,
        "launch": {"hosts": [0, 1]},
        "addresses": [w.address for w in cluster.workers],
    }
    run.storage.write_text("run.json", json.dumps(info))
    monkeypatch.setattr(recover_module, "open_session", lambda config: type("S", (), {})())
    monkeypatch.setattr(recover_module, "attach", lambda *a, **kw: AttachOutcome(ended=True))
    monkeypatch.setattr(recover_module, "wait_for_outcome", lambda run: None)
    # no outcome was written: the workers died
    monkeypatch.setattr(recover_module, "finalize", lambda run: None)
    monkeypatch.setattr(recover_module, "run_is_alive", lambda run: False)
    launch = Launch(hosts=(0, 1), python="py", package="pkg")

    def watch() -> str | None:
        return _attach_and_watch(
            config, run, info, launch, Callbacks(), config.recover, lambda: None, False, None
        )

    # the node is READY: no better word
    assert watch() == "the workers' supervisors are gone (the VMs restarted?)"
    tpu.preempt("rc")
    assert watch() == "node PREEMPTED"


def test_the_watcher_waits_out_an_outage_of_its_own_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A laptop that wakes up has no network for a while: the watcher must not give up a week's run for it.
    The storage reads fail (as ``CloudUnreachable``, what ``gcp.timeout`` ends in) three rounds, then the run
    is found finished. ``finalize`` and the summary are replaced here; the outage itself is
    tests/providers/test_network_down.py."""
    import tpuft.ops.recover as recover_module
    from tpuft.ops.recover import Callbacks, watch
    from tpuft.storage.network import CloudUnreachable

    run = _run(tmp_path)
    config = ClusterConfig.model_validate({"name": "rc", "recover": {"poll": "5s"}})
    rounds: list[int] = []

    def finalize(run: Run) -> dict[str, object]:
        rounds.append(1)
        if len(rounds) <= 3:
            raise CloudUnreachable(
                "list runs gs://b/runs/: no answer from the Cloud Storage API for 30s (connection refused)"
            )
        return {
            "run_id": "r-1",
            "status": "finished",
            "backend": "torch_xla",
            "launch": {"hosts": [0, 1], "python": "py", "package": "pkg"},
        }

    monkeypatch.setattr(recover_module, "resolve_run", lambda config, run_id: run)
    monkeypatch.setattr(recover_module, "finalize", finalize)
    monkeypatch.setattr(
        recover_module, "finished_result", lambda run, info, backend, hosts: ("finished", hosts)
    )
    notices: list[str] = []
    slept: list[float] = []
    assert watch(config, "r-1", Callbacks(on_notice=notices.append), sleep=slept.append) == ("finished", 2)
    assert slept == [5.0, 5.0, 5.0] and len(rounds) == 4
    assert len(notices) == 2, notices  # one word on the outage (not one per poll), one when it is over
    assert (
        "cannot reach Google Cloud (list runs gs://b/runs/: no answer" in notices[0]
        and "every 5 s" in notices[0]
    )
    assert notices[1].startswith("Google Cloud answers again after")


def test_runs_and_monitor_show_the_recoveries(tmp_path: Path) -> None:
    from tpuft.cli.results import _attempt_cell

    info = {
        "attempt": 2,
        "recoveries": [
            {
                "attempt": 1,
                "cause": "node PREEMPTED",
                "last_step": 130,
                "checkpoint_step": 100,
                "steps_lost": 30,
            }
        ],
    }
    assert _attempt_cell(info) == "2 (1 recovery: node PREEMPTED)"
    run = _run(tmp_path)
    run.storage.write_text("run.json", json.dumps({**info, "status": "running", "backend": "torch_xla"}))
    snap = run.snapshot()
    assert snap.recovery_line == (
        "attempt 2, 1 recovery (last: node PREEMPTED at step 130, 30 steps redone from the checkpoint at 100)"
    )
    assert snap.as_json()["recoveries"][0]["steps_lost"] == 30


def test_a_run_taken_over_that_then_fails_on_a_healthy_node_is_not_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``resume RUN --recover`` resumes a run that had ended when it was asked; an attempt it then follows
    that fails on a READY node is the user's code: it ends the watch, not another resume. The attach and the
    node's answer are replaced here (the whole path on the rigs: tests/e2e/test_recovery_rigs.py)."""
    import tpuft.ops.recover as recover_module
    from tpuft.ops.recover import Callbacks, watch

    run = _run(tmp_path)
    config = ClusterConfig.model_validate({"name": "rc"})
    states = iter(["running", "failed"])
    launch = {"hosts": [0, 1], "python": "py", "package": "pkg"}
    monkeypatch.setattr(recover_module, "resolve_run", lambda config, run_id: run)
    monkeypatch.setattr(
        recover_module,
        "finalize",
        lambda run: {"run_id": "r-1", "status": next(states), "backend": "torch_xla", "launch": launch},
    )
    monkeypatch.setattr(recover_module, "node_problem", lambda config, info: None)
    monkeypatch.setattr(recover_module, "_attach_and_watch", lambda *a: None)  # followed to its end
    resumed: list[str] = []
    monkeypatch.setattr(recover_module, "resume", lambda config, run_id, **kw: resumed.append(run_id))
    monkeypatch.setattr(recover_module, "finished_result", lambda run, info, backend, hosts: info["status"])
    assert watch(config, "r-1", Callbacks(), resume_ended=True) == "failed"
    assert resumed == []


def test_connections_closed_under_the_followers_by_the_watch_end_the_attach_with_its_answer(
    tmp_path: Path,
) -> None:
    """When the watch has its answer it closes the fleet's connections under the followers; what the SSH
    library raises as they close (paramiko: ``OSError("Socket is closed")``) is that closing, so the attach
    ends with the answer (and the recovery goes on), not with the error. A stand-in fleet here: the real race
    needs a dying VM at the right moment (tests/e2e/test_recovery_rigs.py runs the whole path)."""
    import threading

    from tpuft.ops.lifecycle import Launch, attach

    closed = threading.Event()

    class ClosingFleet:
        def run(self, *args: object, **kwargs: object) -> object:
            closed.wait(10)
            raise OSError("Socket is closed")

        def close(self) -> None:
            closed.set()

    run = _run(tmp_path)
    run.storage.write_text("run.json", json.dumps({"run_id": "r-1", "status": "running", "attempt": 1}))
    session = type("S", (), {"fleet": ClosingFleet()})()
    outcome = attach(
        session,
        run,
        Launch(hosts=(0, 1), python="py", package="pkg"),
        None,  # type: ignore[arg-type]
        watch=lambda: "node rc-1 (slice 1) PREEMPTED",
        watch_every=0.05,
    )
    assert outcome.gone == "node rc-1 (slice 1) PREEMPTED" and not outcome.ended and outcome.lost == (0, 1)
