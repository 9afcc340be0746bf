"""How much faster is ``tpuft pull`` (transfer_manager, parallel) than downloading a run's objects one by one?

A run dir of 200 files totalling 1 GiB (mixed sizes: many small logs/metadata files, medium checkpoint shards,
a few large ones, all below the 256 MiB sliced-download threshold) is uploaded to the GCS emulator of
tests/rigs/gcs_emulator.py, served from its own process (as GCS would be: the server's work does not share
this process's GIL). Then, each into a fresh folder:

* pull: ``tpuft.ops.pull.pull(url, dest, checkpoints="all")``, its defaults (16 transfer_manager THREAD
  workers), with every file checked against the listed CRC32C and renamed into place;
* download_tree: ``GcsStorage.download_tree`` with its default 8 workers (what pull runs on, minus the
  selection);
* one by one: ``blob.download_to_filename`` for each listed object in a loop (the client checks CRC32C too).

Each method runs ``--rounds`` times (order rotated); the table shows medians. All data lives in a temporary
folder, removed at the end.

The emulator answers one request at a time (see its docstring) over loopback, so with no latency parallel
downloads can only overlap the client's own work (HTTP, checksums, disk writes) with the server's, and on a
2-CPU machine the threads mostly contend for the cores the server also needs: expect no gain there. Against
real GCS every request also waits on a round trip (time to first byte is tens of ms, and small objects are
nothing but that), which is what parallel requests hide: ``--latency-ms`` adds that wait to every request,
concurrently across requests, while the emulator still serves one at a time. On the 2-CPU development VM
(medians of 3):

    latency  one by one     download_tree (8 workers)   tpuft pull (16 workers)
    0 ms     2.05 s         2.53 s (0.81x)              2.76 s (0.74x)
    30 ms    8.73 s         2.75 s (3.18x)              2.88 s (3.03x)

    python benchmarks/pull.py                       # 200 files, 1 GiB, no added latency
    python benchmarks/pull.py --latency-ms 30       # each request waits 30 ms, as in-region GCS roughly does
    python benchmarks/pull.py --files 50 --mib 100  # quicker
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tpuft.ops.pull import pull  # noqa: E402
from tpuft.storage import GcsStorage, open_storage  # noqa: E402

BUCKET = "tpuft-bench"
RUN = "runs/bench-20250101-000000-0001"
MiB = 1024 * 1024
SERVER = """
import sys, threading, time
from functools import partial
from socketserver import ThreadingMixIn
from tests.rigs.gcs_emulator import GcsEmulator, _Handler, _Server

latency = float(sys.argv[1])
gcs = GcsEmulator()
if latency:
    # Each request waits `latency` after it is read, concurrently with other requests (as a network round trip
    # would), then is served one at a time like the rig's own server.
    busy = threading.Lock()

    class SlowHandler(_Handler):
        def parse_request(self):
            ok = super().parse_request()
            time.sleep(latency)
            return ok

    for verb in ("GET", "POST", "PUT", "DELETE", "PATCH"):
        def serialised(self, _verb=verb):
            with busy:
                getattr(_Handler, "do_" + _verb)(self)
        setattr(SlowHandler, "do_" + verb, serialised)

    class ThreadedServer(ThreadingMixIn, _Server):
        daemon_threads = True

    httpd = ThreadedServer(("127.0.0.1", 0), partial(SlowHandler, gcs._storage))
    httpd.rig = gcs
    gcs._httpd = httpd
    threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True).start()
else:
    gcs.start()
print(gcs.endpoint, flush=True)
sys.stdin.read()  # serve until the benchmark closes our stdin
"""


def plan_sizes(files: int, total: int, seed: int = 0) -> list[int]:
    """``files`` sizes summing to ``total``: 60% small (1-64 KiB), 30% medium (1-4 MiB), 10% large (the
    rest)."""
    rng = random.Random(seed)
    small = [rng.randint(1024, 64 * 1024) for _ in range(files * 6 // 10)]
    medium = [rng.randint(MiB, 4 * MiB) for _ in range(files * 3 // 10)]
    n_large = files - len(small) - len(medium)
    rest = total - sum(small) - sum(medium)
    if n_large < 1 or rest < n_large * 4 * MiB:
        raise SystemExit(f"{files} files cannot hold {total / MiB:.0f} MiB with this mix; give more bytes")
    large = [rest // n_large] * n_large
    large[-1] += rest - sum(large)
    return small + medium + large


def write_run(root: Path, sizes: list[int]) -> None:
    """A run dir's shape: logs and metadata small, checkpoint shards medium to large."""
    named = {0: "run.json", 1: "metrics.jsonl", 2: "recipe.yaml"}
    for i, size in enumerate(sizes):
        if i in named:
            rel = named[i]
        elif size < MiB:
            rel = f"logs/worker-{i}.log" if i % 3 == 0 else f"checkpoints/step_00001000/meta/{i:03d}.json"
        else:
            rel = f"checkpoints/step_00001000/state/shard-{i:03d}.bin"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            left = size
            while left:
                chunk = min(left, 16 * MiB)
                f.write(
                    b"{}" + b" " * (chunk - 2) if i in named else os.urandom(chunk)
                )  # run.json: valid JSON
                left -= chunk


def one_by_one(storage: GcsStorage, dest: Path) -> int:
    """The naive loop: list, then ``blob.download_to_filename`` for each object, one after another."""
    folder = f"{storage.prefix}/{RUN}/"
    client = storage._gcs()
    count = 0
    for blob in client.list_blobs(BUCKET, prefix=folder):
        target = dest / blob.name[len(folder) :]
        target.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(target))
        count += 1
    return count


def tree_bytes(root: Path) -> tuple[int, int]:
    files = [p for p in root.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--mib", type=int, default=1024, help="total size in MiB")
    parser.add_argument(
        "--rounds", type=int, default=3, help="each method this many times, order rotated; medians"
    )
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        help="added to every request, concurrently (a network round trip)",
    )
    args = parser.parse_args()

    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(args.latency_ms / 1000)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    work = Path(tempfile.mkdtemp(prefix="tpuft-pull-bench-"))
    try:
        assert server.stdout is not None
        os.environ["STORAGE_EMULATOR_HOST"] = server.stdout.readline().strip()
        os.environ.pop("GOOGLE_CLOUD_PROJECT", None)

        sizes = plan_sizes(args.files, args.mib * MiB)
        started = time.perf_counter()
        write_run(work / "src", sizes)
        print(
            f"wrote {len(sizes)} files, {sum(sizes) / 1e6:.0f} MB in {time.perf_counter() - started:.1f}s",
            file=sys.stderr,
        )

        root = open_storage(f"gs://{BUCKET}/team")
        assert isinstance(root, GcsStorage)
        root.ensure_bucket(None)
        started = time.perf_counter()
        root.upload_tree(work / "src", RUN, workers=8)
        print(f"uploaded to the emulator in {time.perf_counter() - started:.1f}s", file=sys.stderr)
        url = f"{root.url}/{RUN}"

        methods: dict[str, Callable[[Path], object]] = {
            "one by one (download_to_filename)": lambda dest: one_by_one(root, dest),
            "download_tree (transfer_manager, 8 workers)": lambda dest: open_storage(url).download_tree(
                "", dest
            ),
            "tpuft pull (transfer_manager, 16 workers)": lambda dest: pull(url, dest, checkpoints="all"),
        }
        times: dict[str, list[float]] = {name: [] for name in methods}
        names = list(methods)
        for round_ in range(args.rounds):
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                dest = work / "dest"
                began = time.perf_counter()
                methods[name](dest)
                times[name].append(time.perf_counter() - began)
                if tree_bytes(dest) != (len(sizes), sum(sizes)):
                    raise SystemExit(
                        f"{name}: got {tree_bytes(dest)} (files, bytes), expected {len(sizes), sum(sizes)}"
                    )
                print(f"{name}: {times[name][-1]:.2f}s", file=sys.stderr)
                shutil.rmtree(dest)

        nbytes = sum(sizes)
        baseline = statistics.median(times[names[0]])
        header = f"{'method':<45} {'files':>6} {'MB':>7} {'seconds':>8} {'MB/s':>7} {'speed-up':>9}"
        print(
            f"\n{len(sizes)} files, {nbytes / 1e6:.0f} MB from the GCS emulator (own process), "
            f"{args.latency_ms:g} ms added per request, {os.cpu_count()} CPUs; median of {args.rounds}\n"
        )
        print(header)
        print("-" * len(header))
        for name in names:
            seconds = statistics.median(times[name])
            print(
                f"{name:<45} {len(sizes):>6} {nbytes / 1e6:>7.0f} {seconds:>8.2f} "
                f"{nbytes / 1e6 / seconds:>7.1f} "
                f"{baseline / seconds:>8.2f}x"
            )
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
