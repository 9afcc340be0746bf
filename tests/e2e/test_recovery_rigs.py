"""Preemption recovery end to end on the stand-ins: the fake TPU API (a spot multislice queued resource: 2
slices of one host), two sshd pods (the slices before and after the queued resource is recreated, on other
loopback addresses) and the GCS emulator. Workers run the real PyTorch/XLA trainer on CPU.

One run goes through what a week on spot TPUs does to it: every worker's sshd restarts for 6 s (the run goes
on, the attached watcher's first two re-attach tries fail, its third gets in without losing or repeating a
line), the watcher's machine dies and another takes over, slice 1 is preempted (its VM dies; slice 0 lives
on), the watcher stops slice 0's trainer and recreates the whole queued resource, which comes back only after
a wait, on new addresses; the run ends with the step count of an uninterrupted one, resumed from its last
checkpoint, one recovery recorded, naming the lost slice. Before the preemption, the TPU API announces
maintenance on slice 0's node (issue 30): the second watcher asks for a checkpoint with a stop, the trainers
save it before the window, the run stops, and the watcher resumes it once the window is over, with no step
lost; the preemption comes 10 steps into that attempt and is recovered from the same checkpoint. The
checkpoint's latency and margin are printed and kept, and the goodput breakdown's causes add up to the wall
time. ``TPUFT_KEEP_RUN=DIR`` keeps what the docs show of it: the goodput JSON, the plot (``tpuft monitor
--plot``), the second watcher's log.
A second run fails in the user's code on a healthy node: not retried."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.e2e.gcp_rig import bucket_json, rig_cluster, staged_step
from tests.ops.argv_watch import ArgvWatch
from tests.rigs.fake_tpu import FakeTpuServer
from tests.rigs.gcs_emulator import GcsEmulator
from tests.rigs.sshd_pod import SshdPod, kill_processes_with_home_under, sshd_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.backend_venvs("torch_xla"),
    pytest.mark.skipif(not sshd_available(), reason="needs openssh-server"),
]

RECOVER = "recover: {max_attempts: 2, backoff: 1s, poll: 2s}\n"
MAINTENANCE_NOTICE_S = 45.0
"""How far ahead the window is announced (GCE's shortest warning is 60 s: ``maintenance-event``; scheduled
maintenance comes days ahead; shorter here for CI's time, the window being waited out). It covers the
watcher's poll (2 s), the relay to the trainers, up to ``log_every`` steps more (every host saves at a
multiple of it), the save and the final upload (14.6 s from the notice on a quiet machine, 17.4 s at a load of
30+ on 2 cores), and one refusal and the ask after it (a refusal reaches the bucket with the workers' 15 s
run-dir sync)."""
MAINTENANCE_S = 3.0
"""The window's length: the watcher waits it out (the node stays READY: maintenance done in place)."""
SSHD_DOWN_S = 6.0
"""Longer than the watcher's first two re-attach delays (1 s, 2 s: tpuft.ops.lifecycle.REATTACH_DELAYS),
shorter than the third (5 s more): two tries fail, the third gets in. At 20 s the watcher sat 38 s, and the
run had to be longer."""


def _publish_host_keys(tpu: FakeTpuServer, *pods: SshdPod) -> None:
    """Every pod's host keys in the fake API's guest attributes, as a real node publishes its own."""
    if not hasattr(tpu, "host_keys"):
        return
    tpu.host_keys = {pod.addresses[i]: pod.host_public_key(i) for pod in pods for i in range(pod.workers)}


def _restart_sshd(pod: SshdPod, down_s: float) -> None:
    """Every worker's sshd goes away (listeners and sessions; not the trainers, which live in their own
    sessions) and comes back ``down_s`` seconds later on the same address and port."""
    argvs = [list(proc.args) for proc in pod.processes]  # type: ignore[arg-type]
    pod.drop_sessions()
    for proc in pod.processes:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    pod.processes.clear()
    time.sleep(down_s)
    for argv in argvs:
        pod.processes.append(subprocess.Popen(argv, stderr=subprocess.DEVNULL, start_new_session=True))
    pod._wait_listening(30.0)


def _kill_worker(pod: SshdPod, index: int) -> None:
    """One VM dies with everything on it: its sshd and every process of its HOME (supervisor, trainer)."""
    kill_processes_with_home_under(pod.home(index))
    os.killpg(pod.processes[index].pid, signal.SIGKILL)
    pod.processes[index].wait(timeout=10)


def test_a_preempted_spot_run_is_recovered_and_ends_like_an_uninterrupted_one(tmp_path: Path) -> None:
    with (
        FakeTpuServer(operation_polls=1, queued_gets_per_state=3) as tpu,
        SshdPod(tmp_path / "pod-a", workers=2) as first,
        GcsEmulator() as gcs,
        SshdPod(tmp_path / "pod-b", workers=2, first_address=20, port=first.port) as second,
    ):  # real hosts share 22
        marker = f"hf_secret_{os.getpid()}_{int(time.time())}"
        cluster, env = rig_cluster(
            tmp_path, tpu, first, gcs, worker_env={**gcs.env(), "HF_TOKEN": "${TPUFT_TEST_TOKEN}"}
        )
        env["TPUFT_TEST_TOKEN"] = marker  # named in the cluster file, taken from the controller's environment
        argv_scan = ArgvWatch(marker, "-m\x00tpuft.worker\x00", interval=0.2).start()  # the trainers' argv
        _publish_host_keys(tpu, first, second)
        # the user's one key
        (second.root / "authorized_keys").write_text(Path(f"{first.client_key}.pub").read_text())
        multislice = (
            "gcp:\n  queued: true\n  spot: true\n  slices: 2\n"  # 2 slices x 1 host: e2e-gcp-0, e2e-gcp-1
        )
        cluster.write_text(
            cluster.read_text()
            .replace("accelerator: v4-16", "accelerator: v4-8")
            .replace("gcp:\n", multislice)
            + RECOVER
        )

        # enough for the sshd restart, the takeover, the maintenance and the preemption (guards below)
        total = 320
        few = tmp_path / "test.jsonl"  # 24 test numbers: what matters is that the recovered run tests once
        few.write_text(
            "".join(
                (Path(__file__).parents[2] / "tpuft/recipes/data/numbers/test.jsonl")
                .read_text()
                .splitlines(True)[:24]
            )
        )
        args = [
            "--set",
            f"train.steps={total}",
            "--set",
            "train.warmup_steps=5",
            "--set",
            "train.log_every=10",
            "--set",
            "eval.every=1000",
            "--set",
            "eval.max_examples=16",
            "--set",
            "train.checkpoint_every=100",
            "--set",
            f"data.test={few}",
        ]
        out_a = tmp_path / "watcher-a.out"
        watcher_a = subprocess.Popen(
            [sys.executable, "-m", "tpuft", "up", "quickstart", "-c", str(cluster), "--yes", *args],
            env=env,
            stdout=out_a.open("w"),
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            wait_until(lambda: staged_step(first, 0) >= 10, 600, "step 10 on the first node")
            _restart_sshd(first, SSHD_DOWN_S)
            upto = (staged_step(first, 0) // 10 + 2) * 10
            assert upto < total, "the run ended while sshd was down: give it more steps"
            wait_until(
                lambda: f"step {upto}/{total} " in out_a.read_text(),
                240,
                f"the watcher to stream step {upto}",
            )
            streamed = out_a.read_text()
            for step in range(
                10, upto + 1, 10
            ):  # re-attached from the next line: nothing lost, nothing twice
                assert streamed.count(f"step {step}/{total} ") == 1, (step, streamed[-3000:])
        finally:
            watcher_a.kill()  # the first watcher's machine dies
            watcher_a.wait(timeout=10)
        run_id = next((first.home(0) / ".tpuft" / "runs").iterdir()).name
        run_url = f"gs://e2e-bucket/runs/{run_id}"

        other_machine = {**env, "TPUFT_HOME": str(tmp_path / "other-home")}
        out_b = tmp_path / "watcher-b.out"
        watcher_b = subprocess.Popen(
            [sys.executable, "-m", "tpuft", "resume", run_id, "--recover", "-c", str(cluster), "--json"],
            env=other_machine,
            stdout=subprocess.PIPE,
            stderr=out_b.open("w"),
            text=True,
        )
        wait_until(lambda: "watching run" in out_b.read_text(), 120, "the second watcher attached")
        # Maintenance announced on slice 0's node (the TPU API's v2alpha1 upcomingMaintenance; the node stays
        # READY): the watcher asks for a checkpoint and a stop before the window, then resumes the run after
        # it.
        announced = tpu.announce_maintenance("e2e-gcp-0", starts_in=MAINTENANCE_NOTICE_S, lasts=MAINTENANCE_S)
        heard_at = staged_step(first, 0)
        wait_until(
            lambda: "(attempt 2) to recover" in out_b.read_text(), 300, "the run resumed after the window"
        )
        tpu.clear_maintenance("e2e-gcp-0")  # over: the API drops it
        saved_at = int(out_b.read_text().split("checkpoint before maintenance: step ", 1)[1].split(",", 1)[0])
        # The preemption comes 10 steps into attempt 2: its recovery resumes from the maintenance's
        # checkpoint.
        wait_until(
            lambda: staged_step(first, 0) >= saved_at + 10,
            300,
            f"attempt 2 at step {saved_at + 10}",
            interval=0.5,
        )
        reached = staged_step(first, 0)
        assert reached < total - 50, (
            f"the run reached step {reached} before the preemption: give it more steps"
        )
        preempted_at = time.time()
        tpu.preempt("e2e-gcp-1")  # one slice: the queued resource turns SUSPENDING, slice 0 stays READY
        tpu.worker_addresses = second.addresses  # the recreated slices come back elsewhere
        _kill_worker(first, 1)  # slice 1's VM dies with everything on it
        stdout, _ = watcher_b.communicate(timeout=900)
        log_b = out_b.read_text()
        assert watcher_b.returncode == 0, (
            f"{log_b[-6000:]}\nstdout (--json: the error is there):\n{stdout[-3000:]}"
        )
        summary = json.loads(stdout)
        assert summary["run_id"] == run_id and summary["last_train"]["step"] == total, summary

        info = bucket_json(gcs, f"runs/{run_id}/run.json")
        assert info["status"] == "finished" and info["attempt"] == 3, info
        (recovery,) = info["recoveries"]  # the preemption's; the maintenance stop was a planned one
        assert recovery["cause"].startswith("node e2e-gcp-1 (slice 1) PREEMPTED") and recovery["recreated"], (
            recovery
        )
        assert (
            recovery["checkpoint_step"] == saved_at
            and recovery["steps_lost"] == recovery["last_step"] - saved_at > 0
        ), recovery
        assert info["addresses"] == second.addresses and info["attempts"][2]["recovery"] == recovery["cause"]
        window_reason = f"maintenance window at {announced['windowStartTime'][:19]}Z until "
        assert info["attempts"][0]["status"] == "stopped" and window_reason in json.dumps(
            info["attempts"][0]
        ), info["attempts"][0]
        assert info["slices"] == 2, info
        # Slice 0 survived the preemption: the watcher stopped its trainer before deleting the queued resource
        # (or its trainer had seen its peer go first: gloo's "Connection closed by peer"); either way it is
        # not left running.
        assert "stopping the trainers of the slices still up (slice 0 host 0 (worker 0))" in log_b, log_b[
            -4000:
        ]
        survivor = bucket_json(gcs, f"runs/{run_id}/attempts/1/worker-0.json")
        assert (
            survivor is not None and survivor.get("final") and survivor["status"] in {"stopped", "failed"}
        ), survivor
        assert [c.query.get("force") for c in tpu.calls("DeleteQueuedResource")] == ["true"]
        assert summary["recoveries"][0]["back_s"] > 0
        assert (
            "queued resource e2e-gcp: ACCEPTED" in log_b or "WAITING" in log_b or "PROVISIONING" in log_b
        ), log_b[-4000:]
        assert len(tpu.calls("CreateQueuedResource")) == 2

        # The resumed attempt started at the checkpoint: its first logged step is the one after it.
        resumed_log = (second.home(0) / ".tpuft" / "runs" / run_id / "logs" / "worker-0.log").read_text()
        assert f"step {recovery['checkpoint_step'] + 10}/{total} " in resumed_log
        assert f"step {recovery['checkpoint_step']}/{total} " not in resumed_log
        rows: list[dict] = []
        metrics = second.home(0) / ".tpuft" / "runs" / run_id / "metrics.jsonl"
        if metrics.is_file():
            rows = [
                json.loads(line) for line in metrics.read_text().splitlines() if line.strip().startswith("{")
            ]
        tests = [r for r in rows if "test_examples" in r]  # a recovered run still ends with exactly one test
        assert len(tests) == 1 and tests[0]["test_examples"] == 24 and tests[0]["step"] == total, tests
        first_again = min(
            (r["time"] for r in rows if r.get("step", 0) > recovery["checkpoint_step"] and "time" in r),
            default=None,
        )
        print(
            f"recovery: the watcher saw the preemption {recovery['detected'] - preempted_at:.1f} s after "
            f"it; trainers running again {recovery['back_s']} s after that; first logged step after "
            f"it {first_again - preempted_at if first_again else float('nan'):.1f} s after the preemption; "
            f"run ended {time.time() - preempted_at:.0f} s after it; the record: {json.dumps(recovery)}"
        )

        shown = subprocess.run(
            [sys.executable, "-m", "tpuft", "runs", "-c", str(cluster), "--json"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert json.loads(shown.stdout)[-1]["recoveries"][0]["cause"].startswith(
            "node e2e-gcp-1 (slice 1) PREEMPTED"
        )

        # The secret reached the trainers (their environment), and nothing else: no process's argv while it
        # ran, no file tpuft wrote (state, worker homes, logs, watcher logs, the run dir in the bucket).
        argv_scan.stop()
        assert argv_scan.probe_had_secret and argv_scan.in_argv == [], (
            argv_scan.probe_had_secret,
            argv_scan.in_argv,
        )
        written = [p for p in tmp_path.rglob("*") if p.is_file() and marker.encode() in p.read_bytes()]
        assert written == []
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        bucket = storage.Client(project="proj", credentials=AnonymousCredentials()).bucket("e2e-bucket")
        for blob in bucket.list_blobs(prefix=f"runs/{run_id}/"):
            if "/checkpoints/" not in blob.name and "/export/" not in blob.name:
                assert marker.encode() not in blob.download_as_bytes(), blob.name

        # Goodput (issue 30): the run's breakdown from its events; the causes add up to the wall time, and the
        # steps it counts as lost (redone after the checkpoint) agree with the recovery's record within one
        # log interval.
        account = subprocess.run(
            [sys.executable, "-m", "tpuft", "goodput", "-c", str(cluster), "--json"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert account.returncode == 0, account.stderr[-3000:]
        (entry,) = [r for r in json.loads(account.stdout)["runs"] if r["run_id"] == run_id]
        good = entry["goodput"]
        assert abs(good["good_s"] + sum(good["badput"].values()) - good["wall_s"]) <= 0.02 * good["wall_s"], (
            good
        )
        assert abs(good["steps_lost"] - recovery["steps_lost"]) < 10 and (
            good["badput"].get("lost", 0) > 0
        ) == (good["steps_lost"] > 0), (good, recovery)

        # The maintenance: one window, heard from the TPU API by the watcher, its checkpoint complete in run
        # storage before the window began, and no step lost: attempt 1 trained up to that step and attempt 2
        # restored it.
        (window,) = good["maintenance"]
        assert window["step"] == saved_at, window
        assert "TPU API (maintenance e2e-gcp-0 of e2e-gcp)" in window["source"] and window["attempt"] == 1, (
            window
        )
        assert (
            heard_at < saved_at
            and window["before_window_s"] > 0
            and window["stored_s"] >= window["saved_s"] > 0
        ), window
        line = next(n for n in log_b.splitlines() if n.startswith("checkpoint before maintenance: "))
        assert (
            f"step {saved_at}, saved {window['saved_s']} s after the ask" in line
            and "before the window" in line
        ), line
        assert (
            "run stopped with a checkpoint before maintenance; it resumes after the window ends at" in log_b
        )
        from tpuft.readers.runs import Run
        from tpuft.run.goodput import read_events

        events = read_events(Run.from_url(run_url).storage)
        trained = max(e["to_step"] for e in events if e["kind"] == "steps" and e["attempt"] == 1)
        restored = [e["step"] for e in events if e["kind"] == "checkpoint_restore" and e["attempt"] == 2]
        # zero steps lost to maintenance
        assert trained == saved_at and restored == [saved_at], (
            trained,
            restored,
        )
        print(
            f"maintenance: heard at step {heard_at}, {json.dumps(window)}; attempt 1 trained to "
            f"step {trained}, attempt 2 restored step {restored[0]}"
        )
        print(f"goodput of the recovered run: {json.dumps(good)}")
        keep = os.environ.get("TPUFT_KEEP_RUN")
        if keep:  # what docs/operations.md shows of this run
            Path(keep).mkdir(parents=True, exist_ok=True)
            (Path(keep) / "goodput.json").write_text(json.dumps(entry, indent=2))
            (Path(keep) / "watcher-b.log").write_text(log_b)
            plotted = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tpuft",
                    "monitor",
                    run_id,
                    "-c",
                    str(cluster),
                    "--plot",
                    str(Path(keep) / "goodput.png"),
                ],
                env=env,
                capture_output=True,
                text=True,
            )
            assert plotted.returncode == 0, plotted.stderr[-3000:]


def test_a_failure_of_the_users_code_is_not_retried(tmp_path: Path) -> None:
    hook = tmp_path / "hooks.py"
    hook.write_text(
        "import os\n\n"
        "def clean(record):\n"
        "    if os.environ.get('TPUFT_WORKER_ID') == '1':\n"
        "        raise RuntimeError('bad record on worker 1')\n"
        "    return record\n"
    )
    with (
        FakeTpuServer(operation_polls=1) as tpu,
        SshdPod(tmp_path / "pod", workers=2) as pod,
        GcsEmulator() as gcs,
    ):
        cluster, env = rig_cluster(tmp_path, tpu, pod, gcs)
        _publish_host_keys(tpu, pod)
        cluster.write_text(cluster.read_text() + RECOVER)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "tpuft",
                "up",
                "quickstart",
                "-c",
                str(cluster),
                "--yes",
                "--set",
                f"data.preprocess={hook}:clean",
                "--set",
                "train.steps=20",
                "--set",
                "train.warmup_steps=5",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode != 0
        assert "bad record on worker 1" in done.stdout + done.stderr, (done.stdout + done.stderr)[-4000:]
        assert "recovery" not in done.stdout.lower()
        run_id = next((pod.home(0) / ".tpuft" / "runs").iterdir()).name
        info = bucket_json(gcs, f"runs/{run_id}/run.json")
        assert info["status"] == "failed" and not info.get("recoveries") and info["attempt"] == 1
        assert len(tpu.calls("CreateNode")) == 1  # never recreated
