"""How long the controller's data check takes on a big JSON-lines file, and how much memory it holds, printed
as a table. ``tpuft recipes validate`` / ``train`` / ``up`` read every line of the recipe's data before
anything runs; target: seconds per few hundred MB, and memory that does not grow with the file.

Rows, each in a fresh process (peak RSS from getrusage):
  read lines      the floor: iterate over the file's lines, nothing else
  json.loads      each line parsed with the standard library, nothing else
  tpuft check     tpuft.data.check_file (decode, parse, fields, text checks), what preflight runs per
  file tpuft validate  the whole `tpuft recipes validate` command, start-up included

Run: python benchmarks/data_check.py [--mb 200] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from rich.console import Console
from rich.table import Table

WORDS = "zero one two three four five six seven eight nine ten eleven twelve thousand hundred".split()

PROBES = {
    "read lines": """
        n = 0
        with open(PATH, "rb") as f:
            for line in f:
                n += 1
        COUNT = n
    """,
    "json.loads": """
        import json
        n = 0
        with open(PATH, "rb") as f:
            for line in f:
                json.loads(line)
                n += 1
        COUNT = n
    """,
    "tpuft check": """
        from pathlib import Path
        from tpuft.data import Fields, check_file
        result = check_file(Path(PATH), Fields(source_field="question", target_field="answer"))
        assert not result.problems, result.problems[:3]
        COUNT = result.examples
    """,
}

RUNNER = """
import json, resource, sys, time
PATH = sys.argv[1]
started = time.perf_counter()
{body}
seconds = time.perf_counter() - started
print(json.dumps({{"seconds": seconds, "count": COUNT, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""  # noqa: E501 (a script run in another interpreter)


def make_file(path: Path, megabytes: int) -> int:
    rng = random.Random(0)
    target = megabytes * 1_000_000
    written = lines = 0
    with path.open("w", encoding="utf-8") as handle:
        while written < target:
            chunk = []
            for _ in range(1000):
                words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40)))
                row = json.dumps(
                    {
                        "question": f"how do you write {words}?",
                        "answer": str(rng.randint(0, 10**6)),
                        "meta": {"source": "synthetic", "id": lines},
                    }
                )
                chunk.append(row)
                lines += 1
            text = "\n".join(chunk) + "\n"
            handle.write(text)
            written += len(text)
    return lines


def run_probe(name: str, path: Path) -> dict:
    script = RUNNER.format(body=textwrap.dedent(PROBES[name]))
    out = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_validate(path: Path, folder: Path) -> dict:
    import resource
    import time

    recipe = folder / "big.yaml"
    recipe.write_text(
        "name: big\nbackend: {kind: torch_xla}\nmodel: {config: {d_model: 64}}\n"
        f"data: {{train: {path}, source_field: question, target_field: answer}}\n"
        "train: {steps: 10, batch_size: 8}\n"
    )
    cluster = folder / "tpuft.yaml"
    cluster.write_text("name: bench\nprovider: local\nlocal: {workers: 2}\n")
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "tpuft", "recipes", "validate", str(recipe), "-c", str(cluster)],
        check=True,
        capture_output=True,
    )
    seconds = time.perf_counter() - started
    rss = max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, before) / 1024
    return {"seconds": seconds, "count": None, "rss_mb": rss}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=200, help="size of the generated file")
    parser.add_argument("--keep", type=Path, help="write the file here and keep it")
    args = parser.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "big.jsonl"
        with console.status(f"writing {args.mb} MB of JSON lines ..."):
            lines = make_file(path, args.mb)
        size = path.stat().st_size
        run_probe("read lines", path)  # warm the page cache: every row then reads from memory alike
        rows = {name: run_probe(name, path) for name in PROBES}
        rows["tpuft validate"] = run_validate(path, folder)
        table = Table(title=f"data check of {size / 1e6:,.0f} MB, {lines:,} lines (page cache warm)")
        for column in ("what", "seconds", "MB/s", "lines/s", "x json.loads", "peak RSS MB"):
            table.add_column(column, justify="left" if column == "what" else "right")
        base = rows["json.loads"]["seconds"]
        for name, row in rows.items():
            seconds = row["seconds"]
            table.add_row(
                name,
                f"{seconds:.2f}",
                f"{size / 1e6 / seconds:,.0f}",
                f"{lines / seconds:,.0f}",
                f"{seconds / base:.2f}",
                f"{row['rss_mb']:,.0f}",
            )
        console.print(table)


if __name__ == "__main__":
    main()
