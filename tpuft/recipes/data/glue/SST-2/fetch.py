"""Fetch GLUE SST-2 for the sst2_* recipes as GLUE ships it: GLUE's SST-2.zip, unpacked into this folder
unchanged (train.tsv: 67,349 sentences, dev.tsv: 872, test.tsv: 1,821 unlabelled), the files the recipes read
directly.

Each .tsv file is GLUE's own: a header row (``sentence<TAB>label``; test.tsv ``index<TAB>sentence``), one
sentence a line, a tab between the fields and no quoting (a ``"`` is part of the sentence). Needs the network,
stdlib only; it writes beside itself, from whatever folder it is run (``tpuft recipes validate
sst2_t5_small_keras`` prints its whole path):

    python fetch.py            # or --zip SST-2.zip, a copy fetched before
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

URL = "https://dl.fbaipublicfiles.com/glue/data/SST-2.zip"
"""Where GLUE's own download script (download_glue_data.py) fetches SST-2 from."""
MEMBERS = ("SST-2/train.tsv", "SST-2/dev.tsv", "SST-2/test.tsv")
"""The zip's files the recipes (train, dev) and a user (test) read; ``SST-2/original/`` (the treebank) is
left."""


def extract(archive: Path, out: Path) -> dict[str, int]:
    """GLUE's files out of the zip into ``out`` byte for byte (each written beside and renamed, so an
    interrupted fetch leaves no half file): {file name: lines}. A zip without them is refused."""
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, int] = {}
    with zipfile.ZipFile(archive) as zipped:
        names = set(zipped.namelist())
        missing = [member for member in MEMBERS if member not in names]
        if missing:
            raise ValueError(f"{archive}: not GLUE's SST-2.zip (no {', '.join(missing)})")
        for member in MEMBERS:
            target = out / member.rsplit("/", 1)[1]
            partial = target.with_name(target.name + ".partial")
            with zipped.open(member) as source, partial.open("wb") as sink:
                shutil.copyfileobj(source, sink)
            with partial.open("rb") as counted:
                written[target.name] = sum(1 for _ in counted)
            partial.replace(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent, help="folder to write to"
    )
    parser.add_argument("--zip", type=Path, default=None, help="GLUE's SST-2.zip already here (no download)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        archive = args.zip
        if archive is None:
            archive = Path(tmp) / "SST-2.zip"
            print(f"downloading {URL}")
            with urllib.request.urlopen(URL, timeout=60) as response, archive.open("wb") as sink:
                shutil.copyfileobj(response, sink)
        for name, lines in extract(archive, args.out).items():
            print(f"wrote {args.out / name} ({lines - 1:,} rows and the header)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
