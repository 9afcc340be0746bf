"""PyTorch/XLA Multislice: the slices as the outer data-parallel axis of the mesh, and the start-up bound.

On TPU hosts a Multislice run is one SPMD program per host
(:class:`tpuft.worker.torch_xla.replicas.SpmdHosts`) over torch_xla's ``HybridMesh``: ``ici_mesh_shape`` is
the mesh within a slice (its fast inter-chip links), ``dcn_mesh_shape`` the mesh of slices (the data-centre
network). tpuft binds the slices to the outer axis only, so the only traffic between slices is the gradients'
reduction over ``data``, never an FSDP gather:

- data parallel: one axis ``data``, ICI ``(devices per slice,)``, DCN ``(slices,)``;
- ``train.sharding: fsdp``: ``('data', 'fsdp')``, ICI ``(1, devices per slice)``, DCN ``(slices, 1)``: the
  weights are sharded within a slice and replicated across slices, each batch split over both axes.

``HybridMesh`` groups the devices by the ``slice_index`` the TPU runtime gives them (from
``MEGASCALE_SLICE_ID``) and cuts each slice's block with its torus-aware ``_create_device_mesh``;
:func:`hybrid_device_order` is that order for these meshes as a pure function of (slice_index, coords) per
device, tested on CPU against ``HybridMesh``'s own code with stand-in attributes, and
:func:`outer_slices_problem` is the property the trainer checks on the real mesh.

The runtime's rendezvous waits for every host of every slice: libtpu's MegaScale topology discovery, whose one
deadline is ``--megascale_topology_discovery_timeout`` (an absl duration in ``LIBTPU_INIT_ARGS``), set from
``train.startup_timeout`` for every backend by :func:`tpuft.worker.multislice.bound_tpu_startup`. The CPU
pod's gloo rendezvous is bounded in
:func:`tpuft.worker.torch_xla.replicas.rendezvous`. torch_xla is imported only inside :func:`hybrid_mesh`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tpuft.core.records import SliceLayout


@dataclass(frozen=True)
class MeshShape:
    axis_names: tuple[str, ...]
    ici_mesh_shape: tuple[int, ...]
    dcn_mesh_shape: tuple[int, ...]

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return tuple(i * d for i, d in zip(self.ici_mesh_shape, self.dcn_mesh_shape))


def mesh_shape(*, slices: int, devices: int, fsdp: bool) -> MeshShape:
    """The HybridMesh shapes for ``devices`` in all over ``slices`` equal slices (see the module
    docstring)."""
    if slices < 1 or devices % slices:
        raise ValueError(f"{devices} devices do not split into {slices} equal slices")
    per_slice = devices // slices
    if fsdp:
        return MeshShape(("data", "fsdp"), (1, per_slice), (slices, 1))
    return MeshShape(("data",), (per_slice,), (slices,))


def hybrid_device_order(devices: Sequence[tuple[int, Sequence[int]]]) -> list[int]:
    """The device ordinals (the index in ``devices``: each one's ``(slice_index, (x, y, z))``) in the
    flattened order of ``HybridMesh`` for a mesh of :func:`mesh_shape`: slice by slice (slice_index ascending:
    the DCN blocks), and within a slice in the order of its physical torus indexed ``[x, y, z]`` (what
    ``_create_device_mesh_for_nd_torus`` gives when every physical axis folds into one logical axis). One
    device per chip (v4 and later)."""
    return sorted(range(len(devices)), key=lambda d: (devices[d][0], tuple(devices[d][1])))


def outer_slices_problem(device_ids: Sequence[int], slice_of: Sequence[int], slices: int) -> str | None:
    """None when the flattened mesh ``device_ids`` holds slice ``s``'s devices, and only them, in its ``s``-th
    block (the outer axis is the slices); else what is wrong: an inner axis would then cross the DCN every
    step."""
    block = len(device_ids) // slices
    for index in range(slices):
        found = sorted({slice_of[d] for d in device_ids[index * block : (index + 1) * block]})
        if found != [index]:
            return (
                f"block {index} of the mesh's outer axis holds devices of slices {found}, not slice "
                f"{index} alone"
            )
    return None


def hybrid_mesh(*, slices: int, fsdp: bool) -> Any:
    """The TPU Multislice mesh: torch_xla's ``HybridMesh`` over every device of every slice, checked
    slices-outer."""
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    shape = mesh_shape(slices=slices, devices=xr.global_runtime_device_count(), fsdp=fsdp)
    mesh = xs.HybridMesh(
        ici_mesh_shape=shape.ici_mesh_shape, dcn_mesh_shape=shape.dcn_mesh_shape, axis_names=shape.axis_names
    )
    attributes = sorted(
        xr.global_runtime_device_attributes(), key=lambda a: int(str(a["name"]).rsplit(":", 1)[-1])
    )
    problem = outer_slices_problem(list(mesh.device_ids), [int(a["slice_index"]) for a in attributes], slices)
    if problem:
        raise RuntimeError(f"HybridMesh{shape.mesh_shape} is not slices-outer: {problem}")
    return mesh


def mesh_line(layout: SliceLayout, devices: int, axes: Sequence[str]) -> str:
    """The run's mesh, as the trainer logs it: ``mesh: slices 2 x hosts 1 x devices 1 (data)``."""
    return f"mesh: slices {layout.slices} x hosts {layout.hosts} x devices {devices} ({', '.join(axes)})"


def trainer_mesh_line(trainer: Any) -> str:
    """:func:`mesh_line` for a :class:`~tpuft.worker.torch_xla.train.Trainer` after its replicas are set up:
    on TPU the SPMD mesh's axes (or one process per chip: the host's chips), on the CPU pod the workers'
    ``data`` axis (gloo) with the worker's own mesh (``data``, or ``fsdp`` inside it)."""
    layout = trainer.ctx.layout
    if trainer.tpu and trainer.mesh is not None:
        return mesh_line(layout, trainer.local_devices, tuple(trainer.mesh.axis_names))
    if trainer.tpu:
        return mesh_line(layout, trainer.replicas.world // layout.workers, ("data",))
    return mesh_line(layout, trainer.local_devices, ("data", "fsdp") if trainer.fsdp else ("data",))
