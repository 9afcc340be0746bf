"""What the worker-side supervisors cost and how fast they react, on the local pod (2 workers).

* ``failfast``: worker 1's trainer exits with code 3 while worker 0 trains on; the time from the crash (the
  stand-in trainer's own clock at exit) to the last trainer stopped (worker 0's supervisor records when its
  trainer ended), with a controller attached (``tpuft train``) and without one (``tpuft train --detach``).
  Stand-in trainers (tests/ops/standin_trainer.py), real supervisors; median of ``--rounds``.
* ``failfast-bucket``: the same on the cloud stand-ins (fake TPU API, sshd pod, GCS emulator): the supervisors
  learn of the crash through the bucket.
* ``attach``: how long ``tpuft attach`` takes from its start to the first worker line on the screen (a live
  run of stand-in trainers; median of ``--rounds``).
* ``overhead``: the quickstart's training throughput (examples/s, the mean of its logged windows after the
  first, which includes XLA's compilation) under supervision (this tree) and without (the trainer launched
  straight from the fleet, as tpuft did before supervisors, from the git commit ``--baseline``), alternating,
  ``--steps`` steps each.

    python benchmarks/supervision.py failfast attach      # a minute
    python benchmarks/supervision.py overhead --steps 400  # several minutes: real PyTorch/XLA runs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.ops.standin import RECIPE, TRAINER, wrapper  # noqa: E402
from tpuft.backends.torch_xla import BACKEND, TorchXlaBackend  # noqa: E402
from tpuft.host.bootstrap import MARKER  # noqa: E402


class Pod:
    """A 2-worker local cluster in a temporary TPUFT_HOME whose venv runs the stand-in trainer."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {**os.environ, "TPUFT_HOME": str(root / "home"), "COLUMNS": "200"}
        self.cluster = root / "tpuft.yaml"
        cache = root / "venvs"
        self.cluster.write_text(
            f"name: bench\nlocal:\n  workers: 2\n  venv_cache: {cache}\n  python: {sys.executable}\n"
        )
        (root / "train.jsonl").write_text('{"source": "a", "target": "b"}\n' * 4)
        self.recipe = root / "r.yaml"
        self.recipe.write_text(RECIPE)
        venv = cache / BACKEND.env_spec(TorchXlaBackend(), "cpu", sys.executable).key
        (venv / "bin").mkdir(parents=True)
        (venv / MARKER).write_text(
            json.dumps({"python": f"{sys.version_info.major}.{sys.version_info.minor}"})
        )
        (venv / "bin" / "python").write_text(wrapper())
        (venv / "bin" / "python").chmod(0o755)
        self.tpuft("create")
        assert TRAINER.is_file()

    def tpuft(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tpuft", *args, "-c", str(self.cluster)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def home(self, index: int) -> Path:
        return self.root / "home" / "local" / "bench" / "workers" / f"worker-{index}"

    def script(self, index: int, **behaviour: object) -> None:
        self.home(index).mkdir(parents=True, exist_ok=True)
        (self.home(index) / "standin.json").write_text(json.dumps(behaviour))

    def latest_run(self) -> Path:
        return sorted((self.root / "home" / "buckets" / "bench" / "runs").iterdir())[-1]


def failfast(rounds: int) -> list[tuple[str, str]]:
    rows = []
    for mode in ("attached", "detached"):
        delays = []
        for _ in range(rounds):
            with tempfile.TemporaryDirectory() as tmp:
                pod = Pod(Path(tmp))
                pod.script(0)
                pod.script(1, seconds=2, exit=3)
                pod.tpuft("train", str(pod.recipe), *(["--detach"] if mode == "detached" else []))
                run = pod.latest_run()
                deadline = time.monotonic() + 60
                while (
                    json.loads((run / "run.json").read_text()).get("status") == "running"
                    and time.monotonic() < deadline
                ):
                    time.sleep(0.1)
                crash = json.loads((run / "heartbeat" / "worker-1.json").read_text())["time"]
                stopped = json.loads((run / "attempts" / "1" / "worker-0.json").read_text())["ended"]
                delays.append(stopped - crash)
        rows.append(
            (
                f"crash -> last trainer stopped ({mode})",
                f"{statistics.median(delays):.2f} s  (max {max(delays):.2f})",
            )
        )
    return rows


def failfast_bucket(rounds: int) -> list[tuple[str, str]]:
    """The same crash on the cloud stand-ins: the fake TPU API hands out an sshd pod, the run dir is in the
    GCS emulator, so the supervisors learn of the crash through the bucket (a listing every 2.5 s)."""
    from tests.rigs.fake_tpu import FakeTpuServer
    from tests.rigs.gcs_emulator import GcsEmulator
    from tests.rigs.sshd_pod import SshdPod
    from tpuft.storage import open_storage

    delays = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with (
            FakeTpuServer(operation_polls=1) as tpu,
            SshdPod(root / "pod", workers=2) as pod,
            GcsEmulator() as gcs,
        ):
            tpu.worker_addresses = pod.addresses
            tpu.host_keys.update(pod.host_keys)  # the workers' host keys, as the API publishes them
            venv = root / "venvs" / BACKEND.env_spec(TorchXlaBackend(), "cpu", "python3").key
            (venv / "bin").mkdir(parents=True)
            (venv / MARKER).write_text(
                json.dumps({"python": f"{sys.version_info.major}.{sys.version_info.minor}"})
            )
            (venv / "bin" / "python").write_text(wrapper())
            (venv / "bin" / "python").chmod(0o755)
            (root / "train.jsonl").write_text('{"source": "a", "target": "b"}\n' * 4)
            (root / "r.yaml").write_text(RECIPE)
            cluster = root / "tpuft.yaml"
            cluster.write_text(
                f"name: bench-gcp\nprovider: gcp\naccelerator: v4-16\nbucket: gs://bench-bucket\n"
                f"worker_env: {{STORAGE_EMULATOR_HOST: '{gcs.endpoint}'}}\n"
                f"gcp:\n  project: tpuft-test\n  zone: us-central2-b\n  tpu_api_endpoint: {tpu.endpoint}\n"
                f"  worker_device: cpu\n  venv_cache: {root / 'venvs'}\n"
                f"ssh:\n  user: {pod.user}\n  key_file: {pod.client_key}\n  port: {pod.port}\n"
            )
            os.environ.update(gcs.env())
            env = {
                **os.environ,
                "TPUFT_HOME": str(root / "home"),
                "TPUFT_GCP_POLL_SECONDS": "0.02",
                "COLUMNS": "200",
            }

            def tpuft(*args: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    [sys.executable, "-m", "tpuft", *args, "-c", str(cluster)],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=300,
                )

            assert tpuft("create", "--yes").returncode == 0
            for _ in range(rounds):
                for i, behaviour in enumerate(({}, {"seconds": 3, "exit": 3})):
                    pod.home(i).mkdir(parents=True, exist_ok=True)
                    (pod.home(i) / "standin.json").write_text(json.dumps(behaviour))
                started = tpuft("train", str(root / "r.yaml"), "--detach", "--json")
                if started.returncode != 0:
                    raise SystemExit(started.stderr[-3000:])
                run_id = json.loads(started.stdout)["run_id"]
                store = open_storage(f"gs://bench-bucket/runs/{run_id}")
                deadline = time.monotonic() + 120
                while (
                    json.loads(store.read_text("run.json") or "{}").get("status") == "running"
                ) and time.monotonic() < deadline:
                    time.sleep(0.2)
                crash = json.loads(
                    (pod.home(1) / ".tpuft" / "runs" / run_id / "heartbeat" / "worker-1.json").read_text()
                )["time"]
                stopped = json.loads(store.read_text("attempts/1/worker-0.json") or "{}")["ended"]
                delays.append(stopped - crash)
    return [
        (
            "crash -> last trainer stopped (bucket run, sshd pod)",
            f"{statistics.median(delays):.2f} s  (max {max(delays):.2f})",
        )
    ]


def attach_latency(rounds: int) -> list[tuple[str, str]]:
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        pod = Pod(Path(tmp))
        for i in range(2):
            pod.script(i)
        pod.tpuft("train", str(pod.recipe), "--detach")
        time.sleep(2)
        for _ in range(rounds):
            started = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-m", "tpuft", "attach", "-c", str(pod.cluster), "-n", "1"],
                env=pod.env,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("[w"):
                    times.append(time.monotonic() - started)
                    break
            proc.kill()
            proc.wait()
        pod.tpuft("stop")
    return [("tpuft attach: start -> first [wN] line", f"{statistics.median(times):.2f} s")]


def overhead(rounds: int, steps: int, baseline: str) -> list[tuple[str, str]]:
    """Throughput of the same quickstart under this tree (supervised) and under the baseline commit
    (unsupervised)."""
    results: dict[str, list[float]] = {"supervised": [], "unsupervised": []}
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(old), baseline],
            check=True,
            capture_output=True,
        )
        try:
            for _ in range(rounds):
                for label, tree in (("supervised", REPO), ("unsupervised", old)):
                    home = Path(tmp) / f"home-{label}"
                    env = {**os.environ, "TPUFT_HOME": str(home), "PYTHONPATH": str(tree), "COLUMNS": "200"}
                    args = [
                        sys.executable,
                        "-m",
                        "tpuft",
                        "up",
                        "quickstart",
                        "--set",
                        f"train.steps={steps}",
                        "--set",
                        "train.warmup_steps=10",
                        "--set",
                        "train.log_every=25",
                        "--set",
                        "eval.every=100000",
                        "--set",
                        "eval.max_examples=32",
                        "--set",
                        "export.hf=false",
                    ]
                    if label == "supervised":
                        args.append("--stop-on-interrupt")
                    done = subprocess.run(
                        args, env=env, cwd=tree, capture_output=True, text=True, timeout=1800
                    )
                    if done.returncode != 0:
                        raise SystemExit(f"{label} run failed:\n{done.stderr[-3000:]}")
                    run = sorted((home / "buckets" / "tpuft-local" / "runs").iterdir())[-1]
                    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
                    windows = [r["examples_per_s"] for r in rows if "examples_per_s" in r][1:]
                    results[label].append(statistics.mean(windows))
                    subprocess.run(
                        [sys.executable, "-m", "tpuft", "delete", "--yes", "--force"],
                        env=env,
                        cwd=tree,
                        capture_output=True,
                    )
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)], capture_output=True
            )
    sup, unsup = statistics.median(results["supervised"]), statistics.median(results["unsupervised"])
    return [
        (
            f"quickstart examples/s, {steps} steps, unsupervised ({baseline[:10]})",
            f"{unsup:.1f}  ({', '.join(f'{x:.1f}' for x in results['unsupervised'])})",
        ),
        (
            "quickstart examples/s, supervised (this tree)",
            f"{sup:.1f}  ({', '.join(f'{x:.1f}' for x in results['supervised'])})",
        ),
        ("supervision overhead", f"{(unsup - sup) / unsup * 100:+.1f} %"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="+", choices=["failfast", "failfast-bucket", "attach", "overhead"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--baseline", default="2431895", help="a commit from before the supervisors")
    args = parser.parse_args()
    rows: list[tuple[str, str]] = []
    if "failfast" in args.what:
        rows += failfast(args.rounds)
    if "failfast-bucket" in args.what:
        rows += failfast_bucket(args.rounds)
    if "attach" in args.what:
        rows += attach_latency(args.rounds)
    if "overhead" in args.what:
        rows += overhead(max(1, args.rounds // 2), args.steps, args.baseline)
    width = max(len(label) for label, _ in rows)
    print(f"{'measure'.ljust(width)}  value")
    for label, value in rows:
        print(f"{label.ljust(width)}  {value}")


if __name__ == "__main__":
    main()
