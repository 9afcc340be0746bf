"""What recording the run's goodput events costs: examples/s of the local quickstart (PyTorch/XLA, 2-worker
local pod) with recording on and off (``TPUFT_EVENTS=0`` in the cluster file's ``worker_env``), runs
alternated on one pod so that the machine's drift falls on both alike.

Examples/s is the mean of the logged windows after the first (the first holds the compilation). ``log_every``
is small on purpose (10 steps): the trainer writes one ``steps`` event per logged window, so this is more
events per step than a real recipe writes. Each "on" run's events file is checked to be there, and absent from
each "off" run.

    python benchmarks/goodput_overhead.py --runs 3 --steps 200
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
from backends import timing_settings  # the benchmarks' shared settings

REPO = Path(__file__).resolve().parent.parent


def cluster_text(events: bool) -> str:
    off = "worker_env:\n  TPUFT_EVENTS: '0'\n" if not events else ""
    return f"name: bench\nprovider: local\naccelerator: v4-16\nlocal:\n  workers: 2\n{off}"


def train(root: Path, env: dict[str, str], steps: int, events: bool) -> tuple[float, float, int]:
    """(mean examples/s after the first window, the command's wall seconds, events recorded)."""
    cluster = root / "tpuft.yaml"
    cluster.write_text(cluster_text(events))
    sets = timing_settings(steps, log_every=10)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tpuft", "train", "quickstart", "--json", *sets, "-c", str(cluster)],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=3600,
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"tpuft train: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    run = Path(json.loads(done.stdout)["run_dir"])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    speeds = [row["examples_per_s"] for row in rows if "examples_per_s" in row][1:]
    recorded = (
        sum(len(p.read_text().splitlines()) for p in (run / "events").glob("worker-*.jsonl"))
        if (run / "events").is_dir()
        else 0
    )
    if events != bool(recorded):
        raise SystemExit(f"recording {'on' if events else 'off'} but {recorded} events in {run}/events")
    return statistics.mean(speeds), wall, recorded


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="runs of each (alternated)")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = {**os.environ, "TPUFT_HOME": str(root / "home"), "COLUMNS": "200"}
        (root / "tpuft.yaml").write_text(cluster_text(True))
        for verb in (["create"], ["setup", "quickstart"]):
            done = subprocess.run(
                [sys.executable, "-m", "tpuft", *verb, "-c", str(root / "tpuft.yaml")],
                env=env,
                capture_output=True,
                text=True,
                cwd=REPO,
            )
            if done.returncode != 0:
                raise SystemExit(
                    f"tpuft {' '.join(verb)}: exit "
                    f"{done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
                )
        results: dict[bool, list[tuple[float, float, int]]] = {True: [], False: []}
        for _ in range(args.runs):
            for events in (True, False):
                results[events].append(train(root, env, args.steps, events))
    print("| recording | runs | examples/s (mean ± sd of runs) | wall s (mean) | events per run |")
    print("|---|---|---|---|---|")
    for events in (True, False):
        speeds = [r[0] for r in results[events]]
        spread = statistics.pstdev(speeds) if len(speeds) > 1 else 0.0
        print(
            f"| {'on' if events else 'off (TPUFT_EVENTS=0)'} | {len(speeds)} | {statistics.mean(speeds):.1f} "
            f"± {spread:.1f} | "
            f"{statistics.mean(r[1] for r in results[events]):.1f} | {results[events][0][2]} |"
        )
    on, off = (statistics.mean(r[0] for r in results[e]) for e in (True, False))
    print(
        f"\nrecording on / off: {on / off:.3f} of the examples/s "
        f"({'every run: ' + ', '.join(f'{r[0]:.1f}' for r in results[True])} on; "
        f"{', '.join(f'{r[0]:.1f}' for r in results[False])} off)"
    )


if __name__ == "__main__":
    main()
