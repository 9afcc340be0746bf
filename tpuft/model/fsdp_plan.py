"""The FSDP sharding plan: which dimension of each parameter is split over the chips (``train.sharding:
fsdp``).

The PyTorch/XLA trainer shards parameters with ``torch_xla.distributed.spmd`` over a 1-D mesh whose one axis,
``fsdp``, holds every device of every host (FSDPv2 style: each device keeps 1/N of each large matrix, XLA
gathers a layer's weights when it runs and reduce-scatters its gradients). This module decides the partition
specs from names and shapes alone, so the trainer (live ``model.named_parameters()``) and ``tpuft recipes show
--summary`` (shapes from
:mod:`tpuft.model.shapes`) agree on what each chip holds. Pure Python.

The rule, per parameter:
  - vectors (layer norms; any tensor of fewer than 2 dimensions) are replicated: tiny, and every op needs them
    whole;
  - relative attention biases are replicated: a few thousand numbers that every attention layer reads;
  - otherwise the largest dimension that ``mesh_size`` divides is sharded (dimension 0 on a tie): an even
    split, so no device holds padding; a matrix that no dimension divides is replicated (and listed, so it
    shows).

Trainer side, for example::

    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    for name, param in model.named_parameters():
        xs.mark_sharding(param, mesh, fsdp_plan.partition_spec(name, param.shape, mesh.size()))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

AXIS = "fsdp"
"""The name of the mesh axis (``xs.Mesh(device_ids, (n,), (AXIS,))``)."""

REPLICATED_NAMES = ("relative_attention_bias",)
"""Name parts of parameters that are always replicated, whatever their shape."""

Spec = tuple[str | None, ...]


def partition_spec(name: str, shape: Sequence[int], mesh_size: int) -> Spec:
    """The partition spec of one parameter over the 1-D ``fsdp`` mesh: ``AXIS`` on the sharded dimension, None
    on the others; all None (replicated) for vectors, relative attention biases and matrices that no dimension
    of which ``mesh_size`` divides. ``shape`` may be a ``torch.Size``."""
    if mesh_size < 1:
        raise ValueError(f"mesh_size must be at least 1 (got {mesh_size})")
    dims = tuple(int(d) for d in shape)
    replicated: Spec = (None,) * len(dims)
    if len(dims) < 2 or any(part in name for part in REPLICATED_NAMES):
        return replicated
    divisible = [i for i, size in enumerate(dims) if size % mesh_size == 0 and size >= mesh_size]
    if not divisible:
        return replicated
    chosen = max(divisible, key=lambda i: (dims[i], -i))  # the largest; the first one on a tie
    return tuple(AXIS if i == chosen else None for i in range(len(dims)))


def sharded_dim(spec: Spec) -> int | None:
    """The index of the sharded dimension, or None for a replicated parameter."""
    return next((i for i, axis in enumerate(spec) if axis is not None), None)


@dataclass(frozen=True)
class ParamPlan:
    name: str
    shape: tuple[int, ...]
    spec: Spec
    mesh_size: int
    bytes_per_chip: int
    """What one device holds of this parameter (the whole of it when replicated)."""

    @property
    def sharded(self) -> bool:
        return sharded_dim(self.spec) is not None

    @property
    def local_shape(self) -> tuple[int, ...]:
        """This parameter's shard on one device (its whole shape when replicated)."""
        dim = sharded_dim(self.spec)
        return tuple(s // self.mesh_size if i == dim else s for i, s in enumerate(self.shape))


@dataclass(frozen=True)
class Plan:
    mesh_size: int
    bytes_per_element: int
    params: dict[str, ParamPlan]
    axis: str = AXIS

    @property
    def specs(self) -> dict[str, Spec]:
        """``{name: partition spec}``: what the trainer hands ``xs.mark_sharding``."""
        return {name: p.spec for name, p in self.params.items()}

    @property
    def total_bytes(self) -> int:
        """All parameters, whole (what one device would hold without sharding)."""
        return sum(_numel(p.shape) for p in self.params.values()) * self.bytes_per_element

    @property
    def bytes_per_chip(self) -> int:
        """What each device holds: its shard of every sharded parameter plus every replicated one."""
        return sum(p.bytes_per_chip for p in self.params.values())

    @property
    def replicated(self) -> list[str]:
        return [name for name, p in self.params.items() if not p.sharded]

    @property
    def replicated_bytes(self) -> int:
        return sum(p.bytes_per_chip for p in self.params.values() if not p.sharded)

    @property
    def sharded(self) -> list[str]:
        return [name for name, p in self.params.items() if p.sharded]

    def to_json(self) -> dict[str, Any]:
        return {
            "axis": self.axis,
            "mesh_size": self.mesh_size,
            "bytes_per_element": self.bytes_per_element,
            "total_bytes": self.total_bytes,
            "bytes_per_chip": self.bytes_per_chip,
            "sharded": len(self.sharded),
            "replicated": self.replicated,
            "replicated_bytes": self.replicated_bytes,
            "specs": {name: list(spec) for name, spec in self.specs.items()},
        }


def plan(shapes: Mapping[str, Sequence[int]], mesh_size: int, bytes_per_element: int = 4) -> Plan:
    """The plan for every parameter of ``shapes`` (``{name: shape}``, e.g. from ``named_parameters()`` or
    :func:`tpuft.model.shapes.t5_shapes`) over ``mesh_size`` devices; ``bytes_per_element``: 4 for float32
    weights."""
    params: dict[str, ParamPlan] = {}
    for name, shape in shapes.items():
        dims = tuple(int(d) for d in shape)
        spec = partition_spec(name, dims, mesh_size)
        whole = _numel(dims) * bytes_per_element
        held = whole if sharded_dim(spec) is None else whole // mesh_size
        params[name] = ParamPlan(name, dims, spec, mesh_size, held)
    return Plan(mesh_size, bytes_per_element, params)


def _numel(shape: Sequence[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count
