"""Finding and reading the weights of a transformers-TF (Keras) checkpoint: ``tf_model.h5`` in Keras'
``save_weights`` layout, TF-format ``model.safetensors``, and the shards of either beside their
``*.index.json``; each TF variable as it is stored (name, shape, dtype, and how to read it, lazily).

Apart from :mod:`tpuft.convert.keras_ckpt` because it is about file formats, not about models: it knows
nothing of T5 or BERT names, configs or shapes, which is what keras_ckpt maps these weights with. The files
stay open (h5py handles, mapped safetensors) for the lazy loads.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tpuft.convert.model_source import ConvertError
from tpuft.convert.safetensors_io import SafetensorsError, SafetensorsReader, read_header

H5_WEIGHTS = "tf_model.h5"
H5_INDEX = "tf_model.h5.index.json"
SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"

_SAFE_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}


@dataclass(frozen=True)
class TfWeight:
    """One TF variable as stored: its name (as written in the file), shape, dtype, and how to read it."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    read: Callable[[], np.ndarray]
    file: Path
    scoped: bool
    """True when the name still carries the model's scope (``tft5_for_conditional_generation/...``)."""


def safetensors_files(ckpt: Path) -> list[Path]:
    """The checkpoint dir's safetensors files: its one ``model.safetensors``, or the shards its index
    lists."""
    if (ckpt / SAFE_WEIGHTS).is_file():
        return [ckpt / SAFE_WEIGHTS]
    if (ckpt / SAFE_INDEX).is_file():
        return _index_shards(ckpt / SAFE_INDEX)
    return []


def _index_shards(index: Path) -> list[Path]:
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ConvertError(f"{index}: no weight_map in it")
    shards = [index.parent / name for name in sorted(set(weight_map.values()))]
    missing = [p.name for p in shards if not p.is_file()]
    if missing:
        raise ConvertError(f"{index}: shard(s) it lists are missing: {', '.join(missing)}")
    return shards


def safetensors_format(path: Path) -> str | None:
    """The ``format`` a safetensors header states (``"tf"``, ``"pt"``); None when it cannot be read."""
    try:
        return read_header(path)[1].get("format")
    except (SafetensorsError, OSError, KeyError, TypeError, ValueError):
        return None


def open_weights(path: Path) -> tuple[list[TfWeight], str]:
    """Every TF weight in the checkpoint, once each, in file order; and the ModelSource kind."""
    if path.is_file():
        return (
            (_h5_weights(path), "keras-h5")
            if path.suffix == ".h5"
            else (_safetensors_weights(path), "keras-safetensors")
        )
    safe = safetensors_files(path)
    if safe:
        weights = [w for shard in safe for w in _safetensors_weights(shard)]
        return weights, "keras-safetensors"
    if (path / H5_WEIGHTS).is_file():
        return _h5_weights(path / H5_WEIGHTS), "keras-h5"
    if (path / H5_INDEX).is_file():
        return [w for shard in _index_shards(path / H5_INDEX) for w in _h5_weights(shard)], "keras-h5"
    raise ConvertError(f"{path}: no {H5_WEIGHTS}, {H5_INDEX} or TF-format {SAFE_WEIGHTS} in it")


def _safetensors_weights(path: Path) -> list[TfWeight]:
    try:
        reader = SafetensorsReader(path)  # stays open (mapped) for the lazy loads; one per file
    except (SafetensorsError, OSError) as exc:
        raise ConvertError(f"{path}: cannot read: {exc}") from None
    if reader.metadata.get("format") != "tf":
        raise ConvertError(
            f"{path}: not a TensorFlow safetensors file (metadata format {reader.metadata.get('format')!r}, "
            "expected 'tf')"
        )
    weights = []
    for info in reader.tensors.values():
        if info.dtype not in _SAFE_DTYPES:
            raise ConvertError(f"{path}: TF weight {info.name}: unsupported dtype {info.dtype}")
        weights.append(  # BF16 comes back as its uint16 bits: hf_writer knows
            TfWeight(
                info.name,
                info.shape,
                _SAFE_DTYPES[info.dtype],
                lambda r=reader, n=info.name: r.get(n),
                path,
                scoped=False,
            )
        )
    return weights


def _h5_weights(path: Path) -> list[TfWeight]:
    """Keras ``save_weights`` layout: root attr ``layer_names``; per layer a group whose ``weight_names`` attr
    lists its variables, each a dataset at ``<layer>/<weight name>``. transformers' h5 shards instead list
    datasets, named without the model scope, directly in the root ``layer_names``."""
    import h5py  # a core dependency, imported here to keep `tpuft` start-up light

    try:
        handle = h5py.File(path, "r")  # stays open for the lazy loads
    except OSError as exc:
        raise ConvertError(f"{path}: cannot read as HDF5: {exc}") from None
    root = (
        handle["model_weights"]
        if "model_weights" in handle and not _h5_names(handle, "layer_names")
        else handle
    )
    layer_names = _h5_names(root, "layer_names")
    if not layer_names:
        raise ConvertError(f"{path}: no 'layer_names' attribute: not a Keras weights file")
    weights: dict[str, TfWeight] = {}
    for layer in layer_names:
        if layer not in root:
            raise ConvertError(f"{path}: layer {layer!r} is listed but not stored")
        node = root[layer]
        if isinstance(node, h5py.Dataset):  # a transformers shard: the entry is the (unscoped) weight itself
            entries: Iterator[tuple[str, Any, bool]] = iter([(layer, node, False)])
        else:
            entries = ((name, node.get(name), True) for name in _h5_names(node, "weight_names"))
        for name, dataset, scoped in entries:
            if dataset is None:
                raise ConvertError(f"{path}: TF weight {name} is listed in layer {layer!r} but not stored")
            if name in weights:  # the shared embedding is listed by shared, encoder and decoder alike
                continue
            weights[name] = TfWeight(
                name,
                tuple(dataset.shape),
                _h5_dtype(path, name, dataset),
                lambda d=dataset: d[()],
                path,
                scoped,
            )
    return list(weights.values())


def _h5_names(group: Any, attr: str) -> list[str]:
    """A Keras name-list attribute; big ones are split over ``<attr>0``, ``<attr>1``, ... (64 KiB header
    limit)."""
    if attr in group.attrs:
        chunks = [group.attrs[attr]]
    else:
        chunks = []
        while f"{attr}{len(chunks)}" in group.attrs:
            chunks.append(group.attrs[f"{attr}{len(chunks)}"])
    return [
        n.decode("utf8") if isinstance(n, bytes) else str(n) for chunk in chunks for n in np.atleast_1d(chunk)
    ]


def _h5_dtype(path: Path, name: str, dataset: Any) -> str:
    dtype = np.dtype(dataset.dtype)
    if dtype.kind != "f":
        raise ConvertError(f"{path}: TF weight {name}: unsupported dtype {dtype}")
    return dtype.name


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file (an index, a config), or a :class:`ConvertError` naming it."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConvertError(f"{path}: cannot read as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConvertError(f"{path}: expected a JSON object")
    return data
