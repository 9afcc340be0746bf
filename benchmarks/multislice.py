"""Multislice on the local pod: the T5X and PyTorch/XLA quickstarts as 2 slices x 1 worker against 1 slice x 2
workers, side by side in one run (issue 29's measurement).

Both layouts have two worker processes, each pinned to its own core with one device, and the same global
batch: what differs is the mesh (the slices are its outer data-parallel axis, T5X through ``dcn_mesh_shape``,
PyTorch/XLA's replicas slice-major) and the environment (``MEGASCALE_*``). On a CPU there is no data-centre
network, so the step time says what tpuft's layout costs here, not what DCN costs on real slices; the final
exact match says whether the two layouts train the same model.

* final exact match: the last held-out evaluation (``eval_exact_match``) of the full recipe (its own steps).
* s/step: the median wall time per step of the logged windows after the first (the first holds compilation;
  the median leaves out the windows that hold an evaluation).
* wall s: the whole ``tpuft train`` command.

    python benchmarks/multislice.py                         # both backends, the recipes' steps
    python benchmarks/multislice.py --steps t5x=400,torch_xla=1500
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from backends import RECIPES, Pod, table  # the local pod driver of the backends benchmark

LAYOUTS = {"1 slice x 2 workers": "workers: 2", "2 slices x 1 worker": "workers: 1\n  slices: 2"}
DEVICES = "\n  devices_per_worker: 1"
"""One device per worker process: the slices' axis is the point here, and it keeps the runs short. (With the
v4-16's 4 devices per process, T5X's step stalled once here, both processes inside XLA's CPU collectives at
step 50, while the test suite ran beside it; the hang timeout ends such a run.)"""


def one_run(backend: str, layout: str, steps: int | None) -> tuple[str, str, str, str, str]:
    recipe, extra = RECIPES[backend]
    with tempfile.TemporaryDirectory() as tmp:
        pod = Pod(Path(tmp))
        pod.cluster.write_text(
            f"name: bench\nprovider: local\naccelerator: v4-16\nlocal:\n  {LAYOUTS[layout]}{DEVICES}\n"
        )
        for verb in (("create",), ("setup", recipe, *extra)):
            done = pod.tpuft(*verb)
            if done.returncode != 0:
                raise SystemExit(f"{' '.join(verb)}: {done.stderr[-3000:]}")
        sets = ["--set", f"train.steps={steps}"] if steps else []
        started = time.monotonic()
        done = pod.tpuft(
            "train", recipe, "--json", "--stop-on-interrupt", "--set", "export.hf=false", *sets, *extra
        )
        wall = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"{backend} {layout}: {done.stderr[-3000:]}")
        rows = [
            json.loads(line)
            for line in (Path(json.loads(done.stdout)["run_dir"]) / "metrics.jsonl").read_text().splitlines()
            if line.startswith("{")
        ]
    train = [r for r in rows if "elapsed_s" in r and "loss" in r]
    per_step = [
        (b["elapsed_s"] - a["elapsed_s"]) / (b["step"] - a["step"]) for a, b in zip(train[1:], train[2:])
    ]
    evals = [r for r in rows if "eval_exact_match" in r]
    exact = f"{evals[-1]['eval_exact_match']:.3f} (step {evals[-1]['step']})" if evals else "-"
    return backend, layout, exact, f"{statistics.median(per_step):.3f}" if per_step else "-", f"{wall:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", default="t5x,torch_xla", help="comma-separated: t5x, torch_xla")
    parser.add_argument(
        "--steps", default="", help="override the recipes' train.steps: t5x=400,torch_xla=1500"
    )
    args = parser.parse_args()
    steps = {name: int(count) for name, count in (part.split("=") for part in args.steps.split(",") if part)}
    rows = [
        one_run(backend, layout, steps.get(backend))
        for backend in args.backends.split(",")
        for layout in LAYOUTS
    ]
    print("\nMultislice rehearsal on the local pod (v4-16 shape, 2 worker processes, CPU)")
    print(table(("backend", "layout", "final exact match", "s/step", "wall s"), rows))


if __name__ == "__main__":
    main()
