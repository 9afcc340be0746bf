"""Fetch GLUE SST-2 for the sst2_* recipes: train.jsonl (67,349 sentences) and validation.jsonl (872) beside this
file, as JSON lines {"sentence": ..., "label": 0|1} (0 negative, 1 positive), from the Hugging Face hub.

Needs the network and the ``datasets`` package (not one of tpuft's):

    pip install datasets && python recipes/data/glue/sst2/fetch.py
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

DATASET = ("nyu-mll/glue", "sst2")
SPLITS = {"train": "train.jsonl", "validation": "validation.jsonl"}
"""Hub split -> the file the recipes read (data.train, data.eval)."""


def write_jsonl(rows: Iterable[Mapping[str, Any]], path: Path) -> int:
    """The rows as the recipes read them; written beside and renamed, so an interrupted fetch leaves no half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    count = 0
    with partial.open("w", encoding="utf-8") as out:
        for row in rows:
            label = int(row["label"])
            if label not in (0, 1):
                raise ValueError(f"{path.name}: label {label!r} is not 0 or 1 (the test split has no labels)")
            out.write(json.dumps({"sentence": str(row["sentence"]).strip(), "label": label}, ensure_ascii=False) + "\n")
            count += 1
    partial.replace(path)
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent, help="folder to write to")
    args = parser.parse_args(argv)
    try:
        import datasets
    except ImportError:
        print("fetch.py needs the datasets package: pip install datasets", file=sys.stderr)
        return 2
    loaded = datasets.load_dataset(*DATASET)
    for split, name in SPLITS.items():
        count = write_jsonl(loaded[split], args.out / name)
        print(f"wrote {count:,} examples to {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
