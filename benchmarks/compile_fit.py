"""``recipes show --summary --compile`` on every shipped T5X recipe for its target slice, and on a
T5-11B-sized model that must not fit a v4-8 without model parallelism: bytes per chip, the verdict, the
compile's wall time here.

A recipe's target slice is the TPU type its header names (``... on a TPU v4-32``), else the default cluster's
accelerator (the local pod's recipes: ``v4-16``). The T5-11B case is T5X's ``t5_1_0/11B.gin`` (T5's 11B:
d_model 1024, 128 heads of 128, d_ff 65536, 24+24 layers), fine-tuned on the quickstart's data at 512/128
tokens, global batch 32, on a v4-8 with ``num_partitions: 1``. Every run goes through the real CLI, so the
venv and libtpu caches are the ones a user gets (both built once, before the first row; their build time is
not in the table).

    python benchmarks/compile_fit.py              # the markdown table on stdout, one line per compile on
    stderr python benchmarks/compile_fit.py --only t5x_quickstart
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WHEELS = REPO.parent / "shared" / "wheels"
RECIPES = REPO / "tpuft" / "recipes"
GIB = 2**30


def target_slice(path: Path) -> str:
    header = path.read_text(encoding="utf-8").split("\nname:", 1)[0]
    found = re.search(r"\b(v\d\w*-\d+)\b", header)
    if found:
        return found.group(1)
    default = (REPO / "tpuft" / "_defaults" / "tpuft.yaml").read_text(encoding="utf-8")
    match = re.search(r"^accelerator:\s*(\S+)", default, re.MULTILINE)
    assert match is not None
    return match.group(1)


def t5x_recipes() -> list[Path]:
    return [
        p
        for p in sorted(RECIPES.glob("*.yaml"))
        if re.search(r"^\s+kind:\s*t5x\b", p.read_text(), re.MULTILINE)
    ]


def eleven_b(folder: Path) -> Path:
    """The quickstart with T5's 11B in place of its shrunk ByT5 (its gin_overrides dropped)."""
    text = (RECIPES / "t5x_quickstart.yaml").read_text(encoding="utf-8")
    text = re.sub(r"  gin_overrides:.*?\n(?=\S|\n)", "", text, flags=re.DOTALL)
    text = text.replace("family: byt5", "family: t5_1_0").replace("size: small", "size: xxl")
    text = text.replace("name: t5x_quickstart", "name: t5_11b_v4_8").replace(
        "data/numbers", str(RECIPES / "data/numbers")
    )
    text = re.sub(r"max_source_length: \d+", "max_source_length: 512", text)
    text = re.sub(r"max_target_length: \d+", "max_target_length: 128", text)
    path = folder / "t5_11b_v4_8.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def compile_one(recipe: Path, accelerator: str, home: Path) -> dict[str, object]:
    env = {**os.environ, "TPUFT_HOME": str(home), "COLUMNS": "200"}
    argv = [
        sys.executable,
        "-m",
        "tpuft",
        "recipes",
        "show",
        "--summary",
        str(recipe),
        "--force-compile",  # measure the compile even where the paper estimate already decides (the 11B case)
        "--json",
        "--accelerator",
        accelerator,
        "--set",
        f"backend.t5x_source={WHEELS}",
    ]
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=REPO, timeout=3600)
    wall = time.monotonic() - started
    if done.returncode != 0:
        return {
            "recipe": recipe.stem,
            "accelerator": accelerator,
            "error": " / ".join(done.stderr.strip().splitlines()[-5:]),
            "wall_s": wall,
        }
    data = json.loads(done.stdout)
    return {**data["compile"], "wall_s": wall, "paper_total_bytes": data.get("total_bytes")}


def table(rows: list[dict[str, object]]) -> str:
    lines = [
        "| recipe | slice | params | arguments | temporaries | outputs | code | total per chip | HBM "
        "| verdict | step at peak | compile (program) | wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if "error" in row:
            lines.append(
                f"| {row['recipe']} | {row['accelerator']} | | | | | | | | error: {row['error']} | | | "
                f"{row['wall_s']:.0f} s |"
            )
            continue
        c = row["compiled"]
        assert isinstance(c, dict)
        verdict = str(row["verdict"]).replace("|", "/")
        step = row["step_time_lower_bound_s"]
        lines.append(
            f"| {row['recipe']} | {row['accelerator']} | {c['params'] / 1e6:,.1f} M | "
            f"{gib(c['argument_bytes'])} "
            f"| {gib(c['temp_bytes'])} | {gib(c['output_bytes'] - c['alias_bytes'])} | "
            f"{gib(c['generated_code_bytes'])} "
            f"| {gib(c['total_bytes'])} | {gib(row['hbm_bytes_per_device'])} | {verdict} "
            f"| {'' if step is None else f'{float(step) * 1000:.3g} ms'} | {c['compile_s']:.0f} s | "
            f"{row['wall_s']:.0f} s |"
        )
    return "\n".join(lines)


def gib(value: object) -> str:
    number = float(value)  # type: ignore[arg-type]
    return f"{number / GIB:.2f} GiB" if number >= GIB / 10 else f"{number / 2**20:.1f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", action="append", help="recipe names (t5_11b_v4_8 for the 11B case)")
    parser.add_argument("--eleven-b-first", action="store_true", help="compile the T5-11B case first")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tpuft-bench-compile-") as folder:
        cases = [(p, target_slice(p)) for p in t5x_recipes()] + [(eleven_b(Path(folder)), "v4-8")]
        if args.eleven_b_first:  # the longest compile, and the one that must not fit
            cases = cases[-1:] + cases[:-1]
        for recipe, accelerator in cases:
            if args.only and recipe.stem not in args.only:
                continue
            row = compile_one(recipe, accelerator, Path(folder) / "home")
            # the row now: a long run may be cut
            print(
                f"{recipe.stem} on {accelerator}: {row.get('verdict', row.get('error'))} "
                f"({row['wall_s']:.0f} s)\n"
                f"{table([row]).splitlines()[-1]}",
                file=sys.stderr,
                flush=True,
            )
            rows.append(row)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
