"""Write T5X checkpoints the way T5X lays them out on disk, from plain NumPy arrays keyed by T5X parameter
path.

For tests and benchmarks only (tpuft itself only reads T5X checkpoints): legacy = msgpack tree + one gzip zarr
dir per array (small ones inline as flax's ndarray ext type); Orbax = ``state/_METADATA`` + zstd zarr arrays
in one OCDBT store, as T5X 2026 writes by default.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import numpy as np
import tensorstore as ts

CHUNK_ELEMENTS = 1 << 22
"""Split big arrays into chunks of about 16 MB along their first axis, as T5X does for large parameters."""


def _chunks(shape: tuple[int, ...]) -> list[int]:
    rest = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return [max(1, min(shape[0], CHUNK_ELEMENTS // max(rest, 1))), *shape[1:]] if shape else []


def write_legacy(ckpt: Path, params: dict[str, np.ndarray]) -> None:
    """A legacy T5X checkpoint as T5X writes one: msgpack tree + one gzip zarr dir per array (the small ones
    inline)."""
    ckpt.mkdir(parents=True)
    target: dict = {}
    for path, array in params.items():
        node = target
        *parents, leaf = path.split("/")
        for part in parents:
            node = node.setdefault(part, {})
        if array.size < 64:  # inline, flax's ndarray ext type
            node[leaf] = msgpack.ExtType(
                1,
                msgpack.packb(
                    (list(array.shape), "float32", np.ascontiguousarray(array, np.float32).tobytes())
                ),
            )
            continue
        name = "target." + path.replace("/", ".")
        spec = {
            "driver": "zarr",
            "dtype": "float32",
            "kvstore": {"driver": "file", "path": f"{name}/"},
            "metadata": {
                "chunks": _chunks(array.shape),
                "compressor": {"id": "gzip", "level": 1},
                "shape": list(array.shape),
            },
        }
        store = ts.open(
            {**spec, "kvstore": {"driver": "file", "path": str(ckpt / name) + "/"}}, create=True
        ).result()
        store.write(array.astype(np.float32)).result()
        node[leaf] = spec
    step = msgpack.ExtType(1, msgpack.packb(([], "int32", np.int32(7).tobytes())))
    (ckpt / "checkpoint").write_bytes(
        msgpack.packb({"version": 3, "optimizer": {"target": target, "state": {"step": step}}})
    )


def write_orbax(ckpt: Path, params: dict[str, np.ndarray]) -> None:
    """An Orbax PyTree checkpoint as T5X writes one: state/_METADATA + zarr arrays in one OCDBT store."""
    state = ckpt / "state"
    state.mkdir(parents=True)
    tree = {}
    for path, array in {
        **{f"target/{k}": v for k, v in params.items()},
        "state/step": np.array(7, np.int32),
    }.items():
        keys = path.split("/")
        name = ".".join(keys)
        spec = {
            "driver": "zarr",
            "kvstore": {"driver": "ocdbt", "base": f"file://{state}", "path": name},
            "metadata": {"compressor": {"id": "zstd", "level": 1}, "chunks": _chunks(array.shape)},
        }
        store = ts.open(spec, create=True, dtype=ts.dtype(array.dtype.name), shape=array.shape).result()
        store.write(array).result()
        tree[str(tuple(keys))] = {
            "key_metadata": [{"key": k, "key_type": 2} for k in keys],
            "value_metadata": {
                "value_type": "jax.Array",
                "skip_deserialize": False,
                "write_shape": list(array.shape),
            },
        }
    (state / "_METADATA").write_text(
        json.dumps({"tree_metadata": tree, "use_ocdbt": True, "use_zarr3": False})
    )
    (ckpt / "_CHECKPOINT_METADATA").write_text("{}")
