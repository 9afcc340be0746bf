"""Read T5X checkpoints (legacy tensorstore and Orbax) without t5x, flax or JAX.

Two on-disk formats, both written by T5X itself:

* legacy (``use_orbax = False``): ``checkpoint_N/checkpoint`` is a msgpack tree (flax serialization, version
  3) whose leaves are either small arrays stored inline (flax's ndarray ext type) or tensorstore specs
     pointing at
  one zarr dir per parameter beside it (``target.encoder.layers_0.attention.key.kernel/``);
* Orbax (the default): ``checkpoint_N/state/`` is an Orbax PyTree checkpoint: ``_METADATA`` names the tree,
  and the arrays are zarr (or zarr3) arrays inside one OCDBT key-value store (or one dir each without OCDBT).

Both are read with tensorstore, one parameter at a time and only when asked, so nothing here holds more than
the tensor being converted. Only the model's parameters (``target``) are read; the optimizer state never is.
"""

from __future__ import annotations

import ast
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tpuft.convert.model_source import ConvertError, pick_step

LEGACY_FILE = "checkpoint"
ORBAX_METADATA = "_METADATA"
ORBAX_CHECKPOINT_METADATA = "_CHECKPOINT_METADATA"
_STEP_DIR = re.compile(r"^checkpoint_(\d+)$")
_FLAX_NDARRAY_EXT = 1
_FLAX_NATIVE_COMPLEX_EXT = 2
_FLAX_NPSCALAR_EXT = 3
_CHUNKED = "__msgpack_chunked_array__"

Index = tuple[Any, ...]


@dataclass(frozen=True)
class T5xParam:
    path: str
    """T5X's name, ``/``-joined: ``encoder/layers_0/attention/key/kernel``."""
    shape: tuple[int, ...]
    dtype: str
    read: Callable[[Index | None], np.ndarray]
    """Read the whole array, or only ``array[index]`` (one layer of a scanned stack)."""


@dataclass
class T5xCheckpoint:
    kind: str
    """t5x-legacy or t5x-orbax."""
    path: Path
    step: int | None
    params: dict[str, T5xParam]

    def gin_file(self) -> Path | None:
        """The operative config T5X writes into the model dir (beside checkpoint_N), or one in the step
        dir."""
        for candidate in (self.path / "config.gin", self.path.parent / "config.gin"):
            if candidate.is_file():
                return candidate
        return None


def checkpoint_kind(path: Path) -> str | None:
    if (path / LEGACY_FILE).is_file():
        return "t5x-legacy"
    if (path / "state" / ORBAX_METADATA).is_file() or (path / ORBAX_METADATA).is_file():
        return "t5x-orbax"
    return None


def list_step_dirs(model_dir: Path) -> list[tuple[int, Path]]:
    found = []
    if model_dir.is_dir():
        for child in model_dir.iterdir():
            match = _STEP_DIR.match(child.name)
            if match and child.is_dir() and checkpoint_kind(child):
                found.append((int(match.group(1)), child))
    return sorted(found)


def find_t5x_checkpoint(path: Path, step: int | None = None) -> Path | None:
    """``checkpoint_N`` itself, or the model dir holding them (latest, or ``step``). None: not a T5X
    checkpoint."""
    if path.is_file() and path.name == LEGACY_FILE:
        path = path.parent
    if checkpoint_kind(path):
        match = _STEP_DIR.match(path.name)
        if step is None or not match or int(match.group(1)) == step:
            return path
        path = path.parent
    found = list_step_dirs(path)
    return pick_step(found, step, path, "T5X checkpoint") if found else None


def open_t5x_checkpoint(ckpt: Path) -> T5xCheckpoint:
    kind = checkpoint_kind(ckpt)
    match = _STEP_DIR.match(ckpt.name)
    step = int(match.group(1)) if match else None
    if kind == "t5x-legacy":
        params = _legacy_params(ckpt)
    elif kind == "t5x-orbax":
        params = _orbax_params(ckpt)
    else:
        raise ConvertError(
            f"{ckpt}: not a T5X checkpoint (no '{LEGACY_FILE}' file and no Orbax 'state/{ORBAX_METADATA}')"
        )
    if not params:
        raise ConvertError(f"{ckpt}: the checkpoint holds no model parameters ('target' is empty)")
    return T5xCheckpoint(kind=kind, path=ckpt, step=step, params=params)


# ----------------------------------------------------------------------------------------------------------
# legacy: msgpack tree + per-parameter zarr


def _legacy_params(ckpt: Path) -> dict[str, T5xParam]:
    import msgpack

    raw = (ckpt / LEGACY_FILE).read_bytes()
    try:
        tree = msgpack.unpackb(raw, ext_hook=_ext_hook, raw=False, strict_map_key=False)
    except Exception as exc:  # noqa: BLE001 - msgpack raises several unrelated types for a damaged file
        raise ConvertError(f"{ckpt / LEGACY_FILE}: not a readable T5X msgpack checkpoint ({exc})") from None
    if not isinstance(tree, dict):
        raise ConvertError(f"{ckpt / LEGACY_FILE}: expected a dict at the top of the checkpoint tree")
    root = tree.get("optimizer", tree)
    target = root.get("target") if isinstance(root, dict) else None
    if not isinstance(target, dict):
        raise ConvertError(
            f"{ckpt / LEGACY_FILE}: no 'optimizer/target' (model parameters) in the checkpoint tree"
        )
    params: dict[str, T5xParam] = {}
    for path, leaf in _flatten(target):
        params[path] = _legacy_leaf(ckpt, path, leaf)
    return params


def _flatten(tree: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in tree.items():
        path = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, dict) and not _is_spec(value) and _CHUNKED not in value:
            out.extend(_flatten(value, path))
        else:
            out.append((path, value))
    return out


def _is_spec(value: dict) -> bool:
    return "driver" in value and ("kvstore" in value or "path" in value)


def _legacy_leaf(ckpt: Path, path: str, leaf: Any) -> T5xParam:
    if isinstance(leaf, dict) and _is_spec(leaf):
        return _tensorstore_param(path, _local_zarr_spec(ckpt, path, leaf))
    if isinstance(leaf, dict) and _CHUNKED in leaf:
        chunks = leaf.get("chunks", {})
        flat = np.concatenate([np.asarray(chunks[k]).reshape(-1) for k in sorted(chunks, key=int)])
        array = flat.reshape(tuple(leaf["shape"]))
    else:
        array = np.asarray(leaf)
    return T5xParam(
        path, tuple(array.shape), array.dtype.name, lambda index, a=array: a if index is None else a[index]
    )


def _local_zarr_spec(ckpt: Path, path: str, spec: dict) -> dict:
    """T5X writes the zarr dir's path relative to the checkpoint dir (or absolute, gs:// included, in old
    ones): always read the dir of that name beside the msgpack file, wherever the checkpoint has been copied
    to."""
    kvstore = spec.get("kvstore") if isinstance(spec.get("kvstore"), dict) else {}
    relative = str(kvstore.get("path") or spec.get("path") or "").rstrip("/")
    name = relative.split("/")[-1]
    if not name:
        raise ConvertError(f"{ckpt / LEGACY_FILE}: parameter {path}: its tensorstore spec names no path")
    local = ckpt / name
    if not local.is_dir():
        raise ConvertError(f"{ckpt}: parameter {path}: its array dir '{name}/' is missing")
    # tensorstore refuses paths with `..` in them (`Invalid file path`): always hand it an absolute, normal
    # one
    kv = {"driver": "file", "path": os.path.abspath(local) + "/"}
    out: dict[str, Any] = {"driver": spec.get("driver", "zarr"), "kvstore": kv}
    if "dtype" in spec:
        out["dtype"] = spec["dtype"]
    return out


def _ext_hook(code: int, data: bytes) -> Any:
    import msgpack

    if code == _FLAX_NDARRAY_EXT:
        shape, dtype_name, buffer = msgpack.unpackb(data, raw=False)
        return np.frombuffer(buffer, dtype=_numpy_dtype(dtype_name)).reshape(shape)
    if code == _FLAX_NPSCALAR_EXT:
        dtype_name, buffer = msgpack.unpackb(data, raw=False)
        return np.frombuffer(buffer, dtype=_numpy_dtype(dtype_name))[0]
    if code == _FLAX_NATIVE_COMPLEX_EXT:
        real, imag = msgpack.unpackb(data, raw=False)
        return complex(real, imag)
    return msgpack.ExtType(code, data)


def _numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


# ----------------------------------------------------------------------------------------------------------
# Orbax: _METADATA + zarr arrays in an OCDBT store


def _orbax_params(ckpt: Path) -> dict[str, T5xParam]:
    state = ckpt / "state" if (ckpt / "state" / ORBAX_METADATA).is_file() else ckpt
    meta_path = state / ORBAX_METADATA
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as exc:
        raise ConvertError(f"{meta_path}: not JSON ({exc})") from None
    tree = meta.get("tree_metadata")
    if not isinstance(tree, dict):
        raise ConvertError(
            f"{meta_path}: no 'tree_metadata' (not an Orbax PyTree checkpoint this version can read)"
        )
    driver = "zarr3" if meta.get("use_zarr3") else "zarr"
    use_ocdbt = bool(meta.get("use_ocdbt", True))
    base = f"file://{state.resolve()}"
    params: dict[str, T5xParam] = {}
    for raw_key, entry in tree.items():
        keys = _orbax_keys(raw_key, entry)
        if not keys or keys[0] not in {"target", "params"}:
            continue  # optimizer state, step, ...
        value = entry.get("value_metadata", {}) if isinstance(entry, dict) else {}
        if value.get("skip_deserialize"):
            continue
        name = ".".join(keys)
        path = "/".join(keys[1:])
        if use_ocdbt:
            kvstore: dict[str, Any] = {"driver": "ocdbt", "base": base, "path": name}
        else:
            kvstore = {"driver": "file", "path": os.path.abspath(state / name) + "/"}
        params[path] = _tensorstore_param(
            path, {"driver": driver, "kvstore": kvstore}, origin=f"{state}: {name}"
        )
    return params


def _orbax_keys(raw_key: str, entry: Any) -> list[str]:
    if isinstance(entry, dict) and isinstance(entry.get("key_metadata"), list):
        return [str(k["key"]) for k in entry["key_metadata"]]
    try:  # older Orbax: the key alone, a tuple's repr
        parsed = ast.literal_eval(raw_key)
    except (ValueError, SyntaxError):
        return raw_key.split(".")
    return [str(k) for k in parsed] if isinstance(parsed, tuple) else [str(parsed)]


# ----------------------------------------------------------------------------------------------------------
# shared: a lazily-read tensorstore array

_CONTEXT: Any = None


def _tensorstore_param(path: str, spec: dict, origin: str | None = None) -> T5xParam:
    import tensorstore as ts

    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = ts.Context({"cache_pool": {"total_bytes_limit": 0}})  # no cache: read once, keep nothing
    try:
        store = ts.open(spec, read=True, context=_CONTEXT).result()
    except Exception as exc:  # noqa: BLE001 - tensorstore raises ValueError/RuntimeError variants, the reason inside
        raise ConvertError(f"{origin or path}: cannot open parameter {path}: {exc}") from None
    dtype = store.dtype.numpy_dtype.name

    def read(index: Index | None) -> np.ndarray:
        view = store if index is None else store[index]
        try:
            return np.asarray(view.read().result())
        except Exception as exc:  # noqa: BLE001 - as on opening: tensorstore's errors have no common base
            raise ConvertError(f"{origin or path}: cannot read parameter {path}: {exc}") from None

    return T5xParam(path, tuple(int(d) for d in store.shape), dtype, read)
