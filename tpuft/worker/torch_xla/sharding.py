"""SPMD for the PyTorch/XLA trainer. FSDP (``train.sharding: fsdp``, FSDPv2's layout): a 1-D mesh named
``fsdp`` over every device of every host; parameters are sharded on it as :mod:`tpuft.model.fsdp_plan` says,
their optimizer state like them, and each host's batch becomes its slice of the global batch, sharded on the
batch dimension. On several TPU slices the mesh is ``('data', 'fsdp')``, the slices on ``data``
(:mod:`tpuft.worker.torch_xla.multislice`).

On the CPU pod the mesh is this worker's CPU devices (``local.devices_per_worker``, ``CPU_NUM_DEVICES``; one
is still the SPMD code path) and workers average gradients over gloo as in data-parallel runs: torch_xla's
PJRT CPU client has no distributed runtime, so no mesh spans processes. A CPU worker with several devices and
no FSDP runs data-parallel SPMD: a mesh named ``data`` over its devices, the batch split on it, the weights
replicated, which is what one process per chip does on a TPU host. torch_xla is imported in each function:
this module is imported by the trainer before the runtime is chosen.
"""

from __future__ import annotations

from typing import Any


def cpu_devices() -> int:
    """The PJRT CPU devices of this worker: the launch plan's count (``TPUFT_LOCAL_DEVICES``) handed to the
    runtime as ``CPU_NUM_DEVICES`` (read when its client starts, so call this before the first device is
    touched)."""
    import os

    from tpuft.backends.spec import LOCAL_DEVICES_ENV

    if os.environ.get(LOCAL_DEVICES_ENV):
        os.environ["CPU_NUM_DEVICES"] = os.environ[LOCAL_DEVICES_ENV]
    return int(os.environ.get("CPU_NUM_DEVICES") or 1)


def setup_mesh(axis: str, slices: int = 1) -> tuple[Any, int]:
    """Turn SPMD on (before the first device is touched) and set the global mesh, one axis named ``axis``
    (``fsdp`` or ``data``), or on several TPU slices the HybridMesh with the slices outer
    (:func:`tpuft.worker.torch_xla.multislice.hybrid_mesh`); returns (mesh, this host's device count)."""
    import numpy as np
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    if slices > 1:
        from tpuft.worker.torch_xla.multislice import hybrid_mesh

        mesh = hybrid_mesh(slices=slices, fsdp=axis == "fsdp")
    else:
        devices = xr.global_runtime_device_count()
        mesh = xs.Mesh(np.arange(devices), (devices,), (axis,))
    xs.set_global_mesh(mesh)
    return mesh, xr.addressable_runtime_device_count()


def shard_parameters(mesh: Any, named: list[tuple[str, Any]]) -> dict[int, tuple[str | None, ...]]:
    """Mark each parameter's sharding by its name and shape; returns the partition spec of each sharded
    parameter (by id), which its optimizer state gets too."""
    import torch_xla.distributed.spmd as xs

    from tpuft.model.fsdp_plan import AXIS, partition_spec

    size = mesh.shape()[AXIS]  # the fsdp axis (within a slice on several slices), not the whole mesh
    specs: dict[int, tuple[str | None, ...]] = {}
    for name, param in named:
        spec = partition_spec(name, tuple(param.shape), size)
        if any(axis is not None for axis in spec):
            xs.mark_sharding(param, mesh, spec)
            specs[id(param)] = spec
    return specs


def shard_optimizer_state(
    mesh: Any, optimizer: Any, params: list[Any], specs: dict[int, tuple[str | None, ...]]
) -> None:
    """A loaded optimizer state is replicated: shard each tensor of a parameter's shape like its parameter."""
    import torch
    import torch_xla.distributed.spmd as xs

    for param in params:
        spec = specs.get(id(param))
        if spec is None:
            continue
        for value in optimizer.state.get(param, {}).values():
            if isinstance(value, torch.Tensor) and value.shape == param.shape:
                xs.mark_sharding(value, mesh, spec)


def batch_to_device(mesh: Any, device: Any, tensors: tuple[Any, ...]) -> list[Any]:
    """Host tensors to the device, each sharded on its first (batch) dimension over the mesh."""
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs

    out = []
    names = tuple(mesh.axis_names)
    # the batch over every axis: ('data', 'fsdp') on several slices
    axis = names[0] if len(names) == 1 else names
    for tensor in tensors:
        spec = xs.ShardingSpec(mesh, (axis, *([None] * (tensor.dim() - 1))), minibatch=True)
        out.append(xm.send_cpu_data_to_device([tensor], device, spec)[0])
    return out
