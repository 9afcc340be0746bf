"""Peak memory of a worker's training stream over a Hugging Face dataset as the dataset grows (target: flat).

Generates JSON-lines shards of sentence pairs (``--sizes`` in MB, written once to ``--dir``), then streams one
epoch of each through ``open_train_stream`` of ``--module`` (``tpuft.worker.hf_data``; ``data.hf: {path: json,
data_files: [...]}``, shuffle buffer 10,000, batches of 32) in a fresh process, and prints a table: dataset
size, examples, seconds, examples/s, the peak resident memory of the trainer's process (``getrusage``) and of
each data-loader process (``VmHWM`` in /proc, sampled: a fork server's children are not the trainer's).
Run: ``python benchmarks/stream_rss.py --sizes 200,2000``
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent(
    """
    import importlib, json, resource, sys, time
    sys.path.insert(0, sys.argv[2])
    from tpuft.config import DataConfig

    def loader_peak_mb(stream):
        peak = 0
        for reader in getattr(stream, "_live", []):
            process = getattr(reader, "_process", None)
            try:
                with open(f"/proc/{process.pid}/status") as status:
                    for line in status:
                        if line.startswith("VmHWM:"):
                            peak = max(peak, int(line.split()[1]) / 1024)
            except (AttributeError, OSError):
                pass
        return peak

    def main():
        files, workers = json.loads(sys.argv[1]), int(sys.argv[3])
        open_train_stream = importlib.import_module(sys.argv[4]).open_train_stream
        cfg = DataConfig.model_validate({"hf": {"path": "json", "data_files": files, "shuffle_buffer": 10000,
                                                "loader_workers": workers}, "source_field": "source",
                                         "target_field": "target"}, context={"check_files": False})
        started = time.time()
        stream = open_train_stream(cfg, rank=0, world=1, local_batch=32, seed=0, position=None)
        examples = loaders = 0
        while stream.epoch == 0:
            examples += len(next(stream))
            if examples % 32768 == 0:
                loaders = max(loaders, loader_peak_mb(stream))
        loaders = max(loaders, loader_peak_mb(stream))
        stream.close()
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps({"examples": examples, "seconds": time.time() - started, "rss_mb": own,
                          "loader_rss_mb": loaders}))

    if __name__ == "__main__":
        main()
    """
)

WORDS = (
    "the a river mountain city quiet bright old new small large green red blue runs walks sings reads writes "
    "quickly slowly today tomorrow under over near far house garden school market winter summer"
).split()


def make_shards(folder: Path, megabytes: int, shards: int = 8) -> list[str]:
    """``shards`` files of about ``megabytes`` in all (kept between runs)."""
    target = folder / f"{megabytes}mb"
    files = [target / f"part-{i:03d}.jsonl" for i in range(shards)]
    if all(f.is_file() for f in files):
        return [str(f) for f in files]
    target.mkdir(parents=True, exist_ok=True)
    rng = random.Random(megabytes)
    per_file = megabytes * 1_000_000 // shards
    for path in files:
        with path.open("w") as handle:
            written = 0
            while written < per_file:
                source = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40)))
                line = json.dumps({"source": source, "target": source.upper()}) + "\n"
                handle.write(line)
                written += len(line)
    return [str(f) for f in files]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100,1000", help="dataset sizes in MB, comma-separated")
    parser.add_argument("--loader-workers", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/tpuft-stream-bench"))
    parser.add_argument(
        "--module", default="tpuft.worker.hf_data", help="the module whose open_train_stream to use"
    )
    args = parser.parse_args()
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        files = make_shards(args.dir, size)
        on_disk = sum(Path(f).stat().st_size for f in files) / 1e6
        started = time.time()
        script = args.dir / "child.py"
        # a file, not -c: data-loader processes are spawned and re-import the main module
        script.write_text(CHILD)
        done = subprocess.run(
            [
                sys.executable,
                str(script),
                json.dumps(files),
                str(REPO),
                str(args.loader_workers),
                args.module,
            ],
            capture_output=True,
            text=True,
            timeout=3600,
        )
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        got = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append((on_disk, got, time.time() - started))
    print(
        f"\n{args.module}: one epoch, batches of 32, shuffle buffer "
        f"10,000, {args.loader_workers} data-loader processes\n"
    )
    print("| dataset MB | examples | seconds | examples/s | trainer peak RSS MB | peak RSS MB per loader |")
    print("|-----------:|---------:|--------:|-----------:|--------------------:|-----------------------:|")
    for on_disk, got, _ in rows:
        print(
            f"| {on_disk:10.0f} | {got['examples']:8d} | {got['seconds']:7.1f} | "
            f"{got['examples'] / got['seconds']:10.0f} "
            f"| {got['rss_mb']:19.0f} | {got['loader_rss_mb']:22.0f} |"
        )


if __name__ == "__main__":
    main()
