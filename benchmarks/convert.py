"""How fast, and in how much memory, does ``tpuft convert`` turn a t5-base-sized T5X checkpoint into HF
safetensors?

Builds a T5 v1.1 base checkpoint (248 M float32 parameters, random values) in both T5X formats (legacy: gzip
zarr dirs + msgpack; Orbax: zstd zarr in OCDBT), then for each format, with the checkpoint's pages evicted
from the page cache before every measurement:

* read: the time to read the checkpoint's bytes once (every file, sequentially, 8 MiB at a time);
* convert: ``tpuft convert CKPT OUT`` in a fresh process: wall time and that process's peak RSS.

Targets (issue 4): convert wall <= 2x read; peak RSS <= the largest tensor + 500 MB.

    python benchmarks/convert.py                 # t5-base, in a temp dir
    python benchmarks/convert.py --keep /tmp/b   # keep (and reuse) the checkpoints there
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.t5x_builders import write_legacy, write_orbax  # noqa: E402

SIZES = {
    # name: d_model, d_ff, heads, d_kv, layers, vocab
    "base": (768, 2048, 12, 64, 12, 32128),
    "small": (512, 1024, 6, 64, 8, 32128),
    "tiny": (64, 128, 4, 16, 2, 1024),
}


def t5x_params(size: str) -> dict[str, np.ndarray]:
    d_model, d_ff, heads, d_kv, layers, vocab = SIZES[size]
    rng = np.random.default_rng(0)
    inner = heads * d_kv

    def w(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * 0.05

    params = {
        "token_embedder/embedding": w(vocab, d_model),
        "decoder/logits_dense/kernel": w(d_model, vocab),
        "encoder/relpos_bias/rel_embedding": w(heads, 32),
        "decoder/relpos_bias/rel_embedding": w(heads, 32),
        "encoder/encoder_norm/scale": np.ones(d_model, np.float32),
        "decoder/decoder_norm/scale": np.ones(d_model, np.float32),
    }
    for stack in ("encoder", "decoder"):
        attentions = ["attention"] if stack == "encoder" else ["self_attention", "encoder_decoder_attention"]
        norms = (
            ["pre_attention_layer_norm", "pre_mlp_layer_norm"]
            if stack == "encoder"
            else ["pre_self_attention_layer_norm", "pre_cross_attention_layer_norm", "pre_mlp_layer_norm"]
        )
        for i in range(layers):
            p = f"{stack}/layers_{i}"
            for a in attentions:
                for k in ("query", "key", "value"):
                    params[f"{p}/{a}/{k}/kernel"] = w(d_model, inner)
                params[f"{p}/{a}/out/kernel"] = w(inner, d_model)
            params[f"{p}/mlp/wi_0/kernel"] = w(d_model, d_ff)
            params[f"{p}/mlp/wi_1/kernel"] = w(d_model, d_ff)
            params[f"{p}/mlp/wo/kernel"] = w(d_ff, d_model)
            for n in norms:
                params[f"{p}/{n}/scale"] = np.ones(d_model, np.float32)
    return params


def files_of(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def evict(folder: Path) -> None:
    """Drop the folder's pages from the page cache, so that a read goes to the disk (no root needed)."""
    os.sync()
    for path in files_of(folder):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_once(folder: Path) -> tuple[float, int]:
    evict(folder)
    started = time.perf_counter()
    total = 0
    for path in files_of(folder):
        with path.open("rb", buffering=0) as handle:
            while chunk := handle.read(8 << 20):
                total += len(chunk)
    return time.perf_counter() - started, total


def write_once(folder: Path, nbytes: int) -> float:
    """The time to write ``nbytes`` to a new file on the same disk: the floor under any conversion's
    output."""
    block = np.random.default_rng(1).integers(0, 255, 8 << 20, dtype=np.uint8)
    path = folder / "write-floor.bin"
    started = time.perf_counter()
    with path.open("wb") as handle:
        for _ in range(nbytes // block.size):
            handle.write(block.data)
        handle.write(block[: nbytes % block.size].data)
    seconds = time.perf_counter() - started
    path.unlink()
    return seconds


def convert(ckpt: Path, out: Path) -> tuple[float, int]:
    evict(ckpt)
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    proc = subprocess.run(
        _measured(["convert", str(ckpt), str(out), "--json"]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"convert failed: {proc.stderr}")
    return wall, _peak(proc.stderr)


# The child reports its own VmHWM (peak RSS of its address space) at exit. getrusage's ru_maxrss would not do:
# a forked child starts with the parent's resident pages (here, the gigabyte of parameters it just wrote), and
# Linux carries that maximum over exec.
_REPORT = (
    "import atexit, sys; atexit.register(lambda: sys.stderr.write(''.join(l for l in "
    "open('/proc/self/status') "
    "if l.startswith('VmHWM')))); from tpuft.launcher import main; sys.argv[0] = 'tpuft'; main()"
)


def _measured(args: list[str]) -> list[str]:
    return [sys.executable, "-c", _REPORT, *args]


def _peak(stderr: str) -> int:
    for line in stderr.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise SystemExit(f"no VmHWM in the child's output: {stderr[-500:]}")


def idle_rss() -> int:
    """Peak RSS of the CLI doing nothing heavy (imports + --help): what every command costs before any
    tensor."""
    proc = subprocess.run(
        _measured(["convert", "--help"]), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    return _peak(proc.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="base")
    parser.add_argument(
        "--keep", type=Path, help="build (or reuse) the checkpoints here instead of a temp dir"
    )
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="tpuft-bench-convert-"))
    work.mkdir(parents=True, exist_ok=True)
    params: dict[str, np.ndarray] | None = None
    largest = 0
    rows = []
    try:
        for fmt, writer in (("legacy", write_legacy), ("orbax", write_orbax)):
            ckpt = work / f"{args.size}-{fmt}" / "checkpoint_1000"
            if not (ckpt.parent / ".complete").exists():
                shutil.rmtree(ckpt.parent, ignore_errors=True)
                params = params or t5x_params(args.size)
                started = time.perf_counter()
                writer(ckpt, params)
                (ckpt.parent / ".complete").write_text("")
                print(
                    f"built {fmt} checkpoint in {time.perf_counter() - started:.1f}s: {ckpt}", file=sys.stderr
                )
            if not largest:
                d_model, _, _, _, _, vocab = SIZES[args.size]
                largest = d_model * vocab * 4
            read_s, nbytes = read_once(ckpt)
            wall, rss = convert(ckpt, work / f"{args.size}-{fmt}-hf")
            out_bytes = sum(p.stat().st_size for p in files_of(work / f"{args.size}-{fmt}-hf"))
            write_s = write_once(work, out_bytes)
            rows.append((fmt, nbytes, read_s, write_s, wall, rss, out_bytes))
        base_rss = idle_rss()
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    n_params = (
        sum(int(np.prod(v.shape)) for v in (params or t5x_params(args.size)).values())
        if params is not None
        else None
    )
    print(
        f"\nT5 v1.1 {args.size}: largest tensor {largest / 1e6:.0f} MB"
        + (f", {n_params / 1e6:.0f} M params" if n_params else "")
    )
    print(f"CLI process without any tensor (imports, --help): peak RSS {base_rss / 1e6:.0f} MB\n")
    header = (
        f"{'format':<8} {'ckpt MB':>8} {'out MB':>7} {'read s':>7} {'write s':>8} {'convert s':>10} "
        f"{'wall/read':>10} "
        f"{'wall/(read+write)':>18} {'peak RSS MB':>12} {'RSS-largest MB':>15}"
    )
    print(header)
    print("-" * len(header))
    for fmt, nbytes, read_s, write_s, wall, rss, out_bytes in rows:
        print(
            f"{fmt:<8} {nbytes / 1e6:>8.0f} {out_bytes / 1e6:>7.0f} {read_s:>7.2f} {write_s:>8.2f} "
            f"{wall:>10.2f} {wall / read_s:>9.2f}x "
            f"{wall / (read_s + write_s):>17.2f}x {rss / 1e6:>12.0f} {(rss - largest) / 1e6:>15.0f}"
        )
    print(
        "\nread: the checkpoint's bytes once, cold; write: the output's bytes to a new file; convert: a "
        "fresh process"
    )
    print("targets: wall/read <= 2x; peak RSS <= largest tensor + 500 MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
