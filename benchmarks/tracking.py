"""The tracking overhead: training examples/s of the PyTorch/XLA quickstart on the 2-worker local pod with
``report.to: [wandb, mlflow]`` (W&B offline in the run dir, MLflow in the run dir's SQLite store: the sidecar
does all the work it does online, less the network) against TensorBoard only, over several runs of each,
alternated so that a machine's drift hits both alike.

Examples/s is the mean of a run's logged windows after the first (the first holds the compilation); wall is
the whole ``tpuft train`` (it includes the sidecar's start and its last pass after the trainer ends). One pod
is created and set up once (the backend and the tracking venvs, cached).

    python benchmarks/tracking.py --runs 3 --steps 300
    python benchmarks/tracking.py --sidecar-cpu 120

``--sidecar-cpu SECONDS`` measures what the overhead is made of, free of a shared machine's noise: the CPU
time the sidecar itself uses (imports, tailing, W&B offline and MLflow SQLite writes) while a synthetic run
dir gains a train row every second for that long (a log step per second is faster than any real run logs),
then its last pass.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from backends import Pod, table, timing_settings  # the benchmarks' shared local-pod helpers

MODES = {
    "tensorboard only": ["--set", "report.to=[tensorboard]"],
    "wandb + mlflow": [
        "--set",
        "report.to=[tensorboard, wandb, mlflow]",
        "--set",
        "report.wandb.mode=offline",
    ],
}


def measure(runs: int, steps: int) -> list[tuple[str, ...]]:
    common = timing_settings(steps, log_every=10, more={"data.test": None})
    results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    rows: list[tuple[str, ...]] = []
    with tempfile.TemporaryDirectory() as tmp:
        pod = Pod(Path(tmp))
        pod.tpuft("create")
        ready = pod.tpuft("setup", "quickstart", *MODES["wandb + mlflow"])
        if ready.returncode != 0:
            raise SystemExit(ready.stderr[-3000:])
        for index in range(runs):
            for mode, extra in MODES.items():
                started = time.monotonic()
                done = pod.tpuft("train", "quickstart", "--json", "--stop-on-interrupt", *common, *extra)
                wall = time.monotonic() - started
                if done.returncode != 0:
                    raise SystemExit(f"{mode}: {done.stderr[-3000:]}")
                run = Path(json.loads(done.stdout)["run_dir"])
                speeds = [
                    row["examples_per_s"]
                    for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                    if "examples_per_s" in row
                ][1:]
                tracked = json.loads((run / "run.json").read_text()).get("tracking") or {}
                sent = (
                    ", ".join(f"{name} {entry.get('rows', 0)}" for name, entry in sorted(tracked.items()))
                    or "-"
                )
                results[mode].append((statistics.mean(speeds), wall))
                rows.append((mode, str(index + 1), f"{statistics.mean(speeds):.1f}", f"{wall:.0f}", sent))
                print(
                    f"{mode} run {index + 1}: {statistics.mean(speeds):.1f} examples/s, {wall:.0f} s, rows "
                    f"sent: {sent}",
                    flush=True,
                )
    for mode, found in results.items():
        speeds, walls = [s for s, _ in found], [w for _, w in found]
        spread = f" ± {statistics.stdev(speeds):.1f}" if len(speeds) > 1 else ""
        rows.append(
            (mode, "mean", f"{statistics.mean(speeds):.1f}{spread}", f"{statistics.mean(walls):.0f}", "")
        )
    return rows


def sidecar_cpu(seconds: float) -> list[tuple[str, ...]]:
    from tpuft.config import LocalConfig
    from tpuft.config.tracking_env import tracking_spec
    from tpuft.core.paths import venv_cache
    from tpuft.run import rundir

    python = venv_cache() / tracking_spec(LocalConfig().python).key / "bin" / "python"
    if not python.exists():
        raise SystemExit(
            f"no tracking venv at {python}: run the tracking tests (or tpuft setup with report.to) first"
        )
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        (run / rundir.RECIPE).write_text(
            "name: bench\nbackend: {kind: torch_xla}\nreport:\n  to: [tensorboard, wandb, mlflow]\n"
            "  wandb: {mode: offline}\n  samples: 0\n"
        )
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        started = time.monotonic()
        child = subprocess.Popen(
            [
                str(python),
                "-m",
                "tpuft.worker.tracking.sidecar",
                "--run-dir",
                str(run),
                "--run-id",
                "bench",
                "--poll",
                "5",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        step = 0
        with (run / rundir.METRICS).open("a") as metrics:
            while time.monotonic() - started < seconds:
                step += 10
                metrics.write(
                    json.dumps(
                        {
                            "step": step,
                            "time": time.time(),
                            "loss": 1.0 / step,
                            "lr": 1e-3,
                            "examples_per_s": 100.0,
                            "tokens_per_s": 4000.0,
                        }
                    )
                    + "\n"
                )
                metrics.flush()
                time.sleep(1.0)
        rundir.write_json_atomic(run / rundir.TRACKING_STOP, {"status": "finished"})
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.monotonic() - started
        cpu = usage.ru_utime + usage.ru_stime
        state = json.loads((run / rundir.TRACKING).read_text())
    sent = ", ".join(f"{name} {entry.get('rows', 0)}" for name, entry in sorted(state.items()))
    return [(f"{wall:.0f}", str(step // 10), sent, f"{cpu:.1f}", f"{cpu / wall:.1%}")]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument(
        "--sidecar-cpu", type=float, metavar="SECONDS", help="measure the sidecar's own CPU time instead"
    )
    args = parser.parse_args()
    if args.sidecar_cpu:
        print(
            "\nthe tracking sidecar's own CPU time (W&B offline, MLflow SQLite in the run dir, a row a "
            "second)"
        )
        print(
            table(
                ("wall s", "rows written", "rows sent", "sidecar CPU s", "of one core"),
                sidecar_cpu(args.sidecar_cpu),
            )
        )
        return
    rows = measure(args.runs, args.steps)
    print(
        f"\ntracking overhead: quickstart (torch_xla), {args.steps} steps, global batch 32, 2 local workers"
    )
    print(table(("report.to", "run", "examples/s", "wall s", "rows sent"), rows))


if __name__ == "__main__":
    main()
