"""Streaming safetensors reading and writing with NumPy only.

The format is an 8-byte little-endian header length, a JSON header (name -> dtype, shape, byte offsets) and
the raw tensor bytes. Reading maps the file and hands out one tensor at a time; writing lays out the header
first and then streams tensors in, so converting a model never needs more than one tensor in memory (plus the
page cache).
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

_ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
_NUMPY = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": np.uint16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


class SafetensorsError(ValueError):
    pass


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str], int]:
    """Tensor infos, the ``__metadata__`` dict, and where the data section starts."""
    with path.open("rb") as handle:
        raw = handle.read(8)
        if len(raw) != 8:
            raise SafetensorsError(f"{path}: too short to be a safetensors file")
        (length,) = struct.unpack("<Q", raw)
        if length > 100 * 1024 * 1024:
            raise SafetensorsError(f"{path}: header of {length} bytes is not plausible")
        try:
            header = json.loads(handle.read(length))
        except json.JSONDecodeError as exc:
            raise SafetensorsError(f"{path}: header is not JSON: {exc}") from None
    metadata = header.pop("__metadata__", {}) or {}
    infos = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        infos[name] = TensorInfo(name, entry["dtype"], tuple(entry["shape"]), begin, end)
    return infos, metadata, 8 + length


class SafetensorsReader:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.tensors, self.metadata, self._data_start = read_header(path)
        self._file = path.open("rb")
        size = path.stat().st_size
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else None

    def get(self, name: str) -> np.ndarray:
        """The tensor as a NumPy array (BF16 comes back as its raw uint16 bits)."""
        info = self.tensors[name]
        if info.dtype not in _NUMPY:
            raise SafetensorsError(f"{self.path}: tensor {name}: unsupported dtype {info.dtype}")
        assert self._map is not None
        buffer = self._map[self._data_start + info.begin : self._data_start + info.end]
        return np.frombuffer(buffer, dtype=_NUMPY[info.dtype]).reshape(info.shape)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
        self._file.close()

    def __enter__(self) -> SafetensorsReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def float32_to_bfloat16_bits(array: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16, returned as uint16 bit patterns."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    out = (rounded >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(array)
    if nan.any():
        out[nan] = 0x7FC0
    return out


@dataclass(frozen=True)
class PlannedTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    load: Callable[[], np.ndarray]
    """Called when the tensor is written; must return an array already in ``dtype`` (BF16 as uint16 bits)."""


def write_streaming(
    path: Path,
    tensors: list[PlannedTensor],
    metadata: dict[str, str] | None = None,
    *,
    on_tensor: Callable[[int], None] | None = None,
) -> int:
    """Write a safetensors file loading one tensor at a time. Returns the bytes written.

    ``on_tensor`` gets each tensor's byte count once it is on disk (for a progress bar)."""
    header: dict[str, Any] = {}
    offset = 0
    for t in tensors:
        size = int(np.prod(t.shape, dtype=np.int64)) * _ITEMSIZE[t.dtype]
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    if metadata:
        header["__metadata__"] = metadata
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for t in tensors:
            offsets = header[t.name]["data_offsets"]
            _write_one(handle, t, offsets)
            if on_tensor is not None:
                on_tensor(offsets[1] - offsets[0])
    return 8 + len(encoded) + offset


def _write_one(handle: BinaryIO, tensor: PlannedTensor, offsets: list[int]) -> None:
    array = np.ascontiguousarray(tensor.load())
    if tuple(array.shape) != tuple(tensor.shape):
        raise SafetensorsError(
            f"tensor {tensor.name}: shape {array.shape} differs from planned {tensor.shape}"
        )
    data = array.reshape(-1).view(np.uint8)  # the array's own bytes, no copy
    if data.size != offsets[1] - offsets[0]:
        raise SafetensorsError(f"tensor {tensor.name}: {data.size} bytes, expected {offsets[1] - offsets[0]}")
    handle.write(data.data)
