"""Fetch the question-quality data for question_quality_t5_base_keras: Kaggle's "60k Stack Overflow Questions
with Quality Rating" (train.csv: 45,000 questions, valid.csv: 15,000) as train.jsonl and valid.jsonl beside
this file, JSON lines {"Title", "Body", "label"} with the label high (HQ), low (LQ_EDIT) or none (LQ_CLOSE).

Needs the network, the ``kaggle`` command and a Kaggle API token (~/.kaggle/kaggle.json). It writes beside
itself, from whatever folder it is run (``tpuft recipes validate question_quality_t5_base_keras`` prints its
whole path):

    pip install kaggle && python fetch.py

or, with the two CSV files downloaded by hand from the dataset's page into a folder:

    python fetch.py --csv FOLDER
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

KAGGLE_DATASET = "imoore/60k-stack-overflow-questions-with-quality-rate"
FILES = {"train.csv": "train.jsonl", "valid.csv": "valid.jsonl"}
"""Kaggle's file -> the file the recipe reads (data.train, data.eval)."""
LABELS = {"HQ": "high", "LQ_EDIT": "low", "LQ_CLOSE": "none"}
"""Kaggle's Y column -> the one target word the recipe trains on."""


def convert(source: Path, target: Path) -> int:
    """One Kaggle CSV as the recipe's JSON lines; written beside and renamed, so a failure leaves no half
    file."""
    csv.field_size_limit(1 << 24)  # question bodies are long HTML
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    count = 0
    with source.open(newline="", encoding="utf-8") as rows, partial.open("w", encoding="utf-8") as out:
        for row in csv.DictReader(rows):
            quality = row.get("Y")
            if quality not in LABELS:
                raise ValueError(
                    f"{source.name}: row {count + 2}: Y is {quality!r}, not one of {', '.join(LABELS)}"
                )
            out.write(
                json.dumps(
                    {"Title": row["Title"], "Body": row["Body"], "label": LABELS[quality]}, ensure_ascii=False
                )
                + "\n"
            )
            count += 1
    partial.replace(target)
    return count


def download(folder: Path) -> None:
    kaggle = shutil.which("kaggle")
    if kaggle is None:
        raise SystemExit(
            "fetch.py needs the kaggle command (pip install kaggle, and an API token in "
            "~/.kaggle/kaggle.json), or the CSV files downloaded by hand: --csv FOLDER"
        )
    subprocess.run(
        [kaggle, "datasets", "download", "-d", KAGGLE_DATASET, "-p", str(folder), "--unzip"], check=True
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", type=Path, help="a folder holding train.csv and valid.csv (no download)")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent, help="folder to write to"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.csv
        if folder is None:
            folder = Path(scratch)
            download(folder)
        for name, written in FILES.items():
            count = convert(folder / name, args.out / written)
            print(f"wrote {count:,} questions to {args.out / written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
