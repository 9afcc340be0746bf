"""Training throughput of the backends on the same tiny model, data and 2-worker local pod, and setup times.

* ``throughput``: the quickstart task (numbers, global batch 32, the same T5 shape: d_model 128, 4 heads of
  32, gated-GELU MLP 256, 2+2 layers, the 384-id byte vocabulary, float32) trained ``--steps`` steps by the
  PyTorch/XLA backend (``quickstart``), the T5X backend (``t5x_quickstart``) and the Keras backend
  (``keras_quickstart``: MultiWorkerMirroredStrategy, 25 steps per execution), through ``tpuft train``.
  Examples/s is the mean of the logged windows after the first (the first holds the compilation); wall is the
  whole command. T5X packs several examples into a row: its trainer counts examples by the rows' segments, so
  every column counts examples.
* ``mixed``: the same quickstarts (``--backends``) trained with ``train.precision: bf16`` and
  ``train.grad_accum_steps: 2`` against without, one pod per backend (issue 28's measurement); bfloat16 on a
  CPU has no native matrix unit, so the local pod says what the keys cost there, not what they give on a TPU.
* ``setup``: ``tpuft setup`` of the T5X and the Keras recipes, cold (an empty venv cache; pip's own download
  cache stays warm, as on a machine that has installed these wheels before) and cached.

    python benchmarks/backends.py throughput --steps 300
    python benchmarks/backends.py mixed --steps 100 --backends t5x,keras
    python benchmarks/backends.py setup
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
WHEELS = REPO.parent / "shared" / "wheels"


class Pod:
    def __init__(self, root: Path, venv_cache: Path | None = None) -> None:
        self.env = {**os.environ, "TPUFT_HOME": str(root / "home"), "COLUMNS": "200"}
        self.cluster = root / "tpuft.yaml"
        cache = f"\n  venv_cache: {venv_cache}" if venv_cache else ""
        self.cluster.write_text(
            f"name: bench\nprovider: local\naccelerator: v4-16\nlocal:\n  workers: 2{cache}\n"
        )

    def tpuft(self, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tpuft", *args, "-c", str(self.cluster)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
        )


RECIPES = {
    "torch_xla": ("quickstart", []),
    "t5x": ("t5x_quickstart", ["--set", f"backend.t5x_source={WHEELS}"]),
    "keras": ("keras_quickstart", []),
}
MIXED = ["--set", "train.precision=bf16", "--set", "train.grad_accum_steps=2"]


def settings(values: dict[str, object]) -> list[str]:
    """``--set key=value`` for each of ``values``, written as the recipe's YAML reads them (None is null)."""
    written = {None: "null", True: "true", False: "false"}
    out: list[str] = []
    for key, value in values.items():
        text = written[value] if value is None or isinstance(value, bool) else str(value)
        out += ["--set", f"{key}={text}"]
    return out


def timing_settings(steps: int, log_every: int, more: dict[str, object] | None = None) -> list[str]:
    """What every speed measurement trains with: ``steps`` steps logged every ``log_every``, after a 10-step
    warm-up, and nothing else in the loop (no evaluation, periodic checkpoint or export) so that the
    windows time the steps alone; ``more`` adds the measurement's own settings."""
    return settings(
        {
            "train.steps": steps,
            "train.log_every": log_every,
            "train.warmup_steps": 10,
            "eval.every": None,
            "train.checkpoint_every": None,
            "export.hf": False,
            **(more or {}),
        }
    )


def train_speed(pod: Pod, backend: str, steps: int, sets: list[str]) -> tuple[float, float, float]:
    """(mean examples/s over the logged windows after the first, their spread, the command's wall seconds)."""
    recipe, extra = RECIPES[backend]
    common = timing_settings(steps, log_every=25)
    started = time.monotonic()
    done = pod.tpuft("train", recipe, "--json", "--stop-on-interrupt", *common, *extra, *sets)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{recipe}: {done.stderr[-3000:]}")
    run = Path(json.loads(done.stdout)["run_dir"])
    windows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    speeds = [row["examples_per_s"] for row in windows if "examples_per_s" in row][1:]
    return statistics.mean(speeds), statistics.pstdev(speeds), wall


def on_pod(backend: str, runs: list[list[str]], steps: int) -> list[tuple[float, float, float]]:
    """Each of ``runs`` (recipe --set arguments) trained in turn on one fresh 2-worker pod of ``backend``."""
    recipe, extra = RECIPES[backend]
    with tempfile.TemporaryDirectory() as tmp:
        pod = Pod(Path(tmp))
        pod.tpuft("create")
        pod.tpuft("setup", recipe, *extra)
        return [train_speed(pod, backend, steps, sets) for sets in runs]


def throughput(steps: int, backends: list[str]) -> list[tuple[str, str, str, str]]:
    rows = []
    for backend in RECIPES:
        if backend in backends:
            ((mean, spread, wall),) = on_pod(backend, [[]], steps)
            rows.append((backend, f"{mean:.1f}", f"{spread:.1f}", f"{wall:.0f}"))
    return rows


def mixed(steps: int, backends: list[str]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for backend in RECIPES:
        if backend not in backends:
            continue
        plain, keyed = on_pod(backend, [[], MIXED], steps)
        for label, (mean, spread, wall) in (("float32", plain), ("bf16 + grad_accum_steps 2", keyed)):
            rows.append(
                (backend, label, f"{mean:.1f}", f"{spread:.1f}", f"{wall:.0f}", f"{mean / plain[0]:.2f}")
            )
    return rows


def setup() -> list[tuple[str, str, str]]:
    rows = []
    for recipe, extra in (
        ("t5x_quickstart", ["--set", f"backend.t5x_source={WHEELS}"]),
        ("keras_quickstart", []),
    ):
        with tempfile.TemporaryDirectory() as tmp:
            pod = Pod(Path(tmp), venv_cache=Path(tmp) / "venvs")
            pod.tpuft("create")
            for label in ("cold (empty venv cache)", "cached"):
                started = time.monotonic()
                done = pod.tpuft("setup", recipe, *extra)
                if done.returncode != 0:
                    raise SystemExit(done.stderr[-3000:])
                rows.append((recipe, label, f"{time.monotonic() - started:.1f}"))
    return rows


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", nargs="+", choices=["throughput", "mixed", "setup"])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--backends", default="torch_xla,t5x,keras", help="comma-separated, for throughput")
    args = parser.parse_args()
    if "throughput" in args.what:
        print(f"\nthroughput, {args.steps} steps, global batch 32, 2 local workers")
        print(
            table(
                ("backend", "examples/s", "spread (sd)", "wall s"),
                throughput(args.steps, args.backends.split(",")),
            )
        )
    if "mixed" in args.what:
        print(f"\nbf16 + gradient accumulation, {args.steps} steps, global batch 32, 2 local workers")
        print(
            table(
                ("backend", "keys", "examples/s", "spread (sd)", "wall s", "x float32"),
                mixed(args.steps, args.backends.split(",")),
            )
        )
    if "setup" in args.what:
        print("\ntpuft setup (2 local workers, one shared venv)")
        print(table(("recipe", "setup", "seconds"), setup()))


if __name__ == "__main__":
    main()
