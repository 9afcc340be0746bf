"""Cold start of `tpuft --help` against `python -c pass` (target: at most 3x), printed as a table.

Each command runs `--runs` times after one warm-up (which fills the OS page cache, as on any second use); the
table shows the median and the best. Also reports which heavy modules `import tpuft.cli` pulls in (none
allowed). Run: python benchmarks/cli_startup.py
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

HEAVY = ("torch", "tensorflow", "jax", "transformers", "torch_xla", "numpy")


def timed(argv: list[str], runs: int) -> list[float]:
    subprocess.run(argv, capture_output=True, check=True)  # warm-up
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True)
        samples.append(time.perf_counter() - started)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    cases = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import tpuft.cli'": [sys.executable, "-c", "import tpuft.cli"],
        "tpuft --help": [sys.executable, "-m", "tpuft", "--help"],
        "tpuft --version": [sys.executable, "-m", "tpuft", "--version"],
        "tpuft train --help (Typer + Rich)": [sys.executable, "-m", "tpuft", "train", "--help"],
        "tpuft recipes ls": [sys.executable, "-m", "tpuft", "recipes", "ls"],
    }
    results = {name: timed(argv, args.runs) for name, argv in cases.items()}
    base = statistics.median(results["python -c pass"])
    table = Table(title=f"CLI start-up ({args.runs} runs each, after a warm-up)")
    for column in ("command", "median ms", "best ms", "x python"):
        table.add_column(column, justify="right" if column != "command" else "left")
    for name, samples in results.items():
        median = statistics.median(samples)
        table.add_row(name, f"{median * 1000:.0f}", f"{min(samples) * 1000:.0f}", f"{median / base:.2f}")
    console = Console()
    console.print(table)
    ratio = statistics.median(results["tpuft --help"]) / base
    verdict = "OK" if ratio <= 3.0 else "OVER TARGET"
    console.print(f"tpuft --help = {ratio:.2f}x python -c pass (target <= 3x): {verdict}")
    probe = f"import sys, tpuft.cli; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    console.print(f"heavy modules imported by tpuft.cli: {loaded or 'none'}")


if __name__ == "__main__":
    main()
