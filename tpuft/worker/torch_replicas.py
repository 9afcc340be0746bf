"""How the PyTorch/XLA trainer's replicas stay in step: the replication strategies (which average gradients and sum
numbers across replicas), the RNG seed each replica draws from, and the weight digest that shows they all ended with
identical weights.

- local CPU pod: one process per worker, over its PJRT CPU devices (one, or an SPMD mesh of
  ``local.devices_per_worker``: :mod:`tpuft.worker.torch_sharding`); gradients (and the step's loss and token count,
  in the same buffer) are averaged with torch.distributed over gloo, worker 0 being the rendezvous (:class:`Gloo`).
- TPU host: one process per local chip (``torch_xla.launch``); gradients are averaged with XLA collectives
  (``xm.reduce_gradients``) across every chip of every host (:class:`XlaCollectives`).
- TPU with ``train.sharding: fsdp``: one SPMD program per host over every chip (:class:`SpmdHosts`).

Imports nothing heavy at module level: :func:`rng_seed` is tested without torch.
"""

from __future__ import annotations

import datetime
import hashlib
from typing import Any


class Single:
    """One replica: nothing to average."""

    rank = 0
    world = 1
    local_rank = 0

    def reduce_gradients(self, params: list[Any], optimizer: Any, extras: Any) -> Any:
        return extras

    def sum(self, tensor: Any) -> Any:
        return tensor

    def close(self) -> None:
        pass


class Gloo:
    """CPU pod: gradients go to the host, are averaged with gloo, and come back to the XLA device."""

    def __init__(self, rank: int, world: int, coordinator: str, device: Any) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.rank, self.world, self.device = rank, world, device
        self.local_rank = 0  # one process per worker
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{coordinator}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(minutes=30),
        )

    def reduce_gradients(self, params: list[Any], optimizer: Any, extras: Any) -> Any:
        import torch

        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads] + [extras.reshape(-1).to(grads[0].dtype)])
        host = flat.cpu()  # runs the forward/backward graph
        self.dist.all_reduce(host)
        host /= self.world
        back = host.to(self.device)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(back[offset : offset + n].view_as(g))
            offset += n
        return host[offset:]

    def sum(self, tensor: Any) -> Any:
        host = tensor.cpu()
        self.dist.all_reduce(host)
        return host

    def close(self) -> None:
        self.dist.destroy_process_group()


class SpmdHosts:
    """TPU with ``train.sharding: fsdp``: one SPMD program over every chip of every host. Each host feeds its slice
    of the global batch; the compiler inserts the gradient reductions, so there is nothing to average, and a sum
    over the global batch is already global."""

    implicit = True

    def __init__(self) -> None:
        import torch_xla.runtime as xr

        self.rank, self.world = xr.process_index(), xr.process_count()
        self.local_rank = 0

    def reduce_gradients(self, params: list[Any], optimizer: Any, extras: Any) -> Any:
        return extras

    def sum(self, tensor: Any) -> Any:
        return tensor.cpu()

    def close(self) -> None:
        pass


class XlaCollectives:
    """TPU: every chip of every host is a replica; XLA all-reduces over ICI/DCN inside the step's graph."""

    def __init__(self) -> None:
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr

        self.xm = xm
        self.rank, self.world = xr.global_ordinal(), xr.world_size()
        self.local_rank = xr.local_ordinal()  # one process per chip; the first one speaks for the host

    def reduce_gradients(self, params: list[Any], optimizer: Any, extras: Any) -> Any:
        self.xm.reduce_gradients(optimizer)
        return self.xm.all_reduce(self.xm.REDUCE_SUM, extras, scale=1.0 / self.world)

    def sum(self, tensor: Any) -> Any:
        return self.xm.all_reduce(self.xm.REDUCE_SUM, tensor).cpu()

    def close(self) -> None:
        pass


def make_replicas(*, tpu: bool, spmd: bool, workers: int, worker: int, coordinator: str, device: Any) -> Any:
    """The strategy for where this process runs (see the module docstring)."""
    if tpu and spmd:
        return SpmdHosts()
    if tpu:
        return XlaCollectives()
    if workers > 1:
        return Gloo(worker, workers, coordinator, device)
    return Single()


def check_same_start(replicas: Any, torch: Any, device: Any, start_step: int) -> None:
    """Every replica picks the latest complete checkpoint itself: make sure they all picked the same one (a replica
    that went on from another step would silently train different weights)."""
    if replicas.world == 1 or getattr(replicas, "implicit", False):
        return
    parts = [start_step % 4096, start_step // 4096]  # int32-safe sums over thousands of replicas
    total = replicas.sum(torch.tensor(parts, dtype=torch.int32, device=device))
    if [int(v) for v in total] != [v * replicas.world for v in parts]:
        raise RuntimeError(
            f"replica {replicas.rank} resumes from step {start_step}, but not every replica does: "
            "the workers see different checkpoints"
        )


def rng_seed(seed: int, replica: int, step: int) -> int:
    """The RNG seed of ``replica`` from ``step`` on: a hash, so that nearby (seed, replica, step) give unrelated
    streams; below 2**63, which every generator takes."""
    digest = hashlib.sha256(f"tpuft-rng {seed} {replica} {step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def params_digest(state: dict[str, Any]) -> str:
    """sha256 over every tensor in name order, each framed by its name, dtype and shape (so that neither a renamed,
    a reshaped nor a differently split tensor can give the same bytes): equal digests mean identical weights."""
    import torch

    digest = hashlib.sha256(f"tpuft-weights-v1 {len(state)}".encode())
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        digest.update(f"\0{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def to_cpu(torch: Any, obj: Any) -> Any:
    """``obj`` (an optimizer state: nested dicts, lists and tensors) with every tensor copied to the host."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu")
    if isinstance(obj, dict):
        return {k: to_cpu(torch, v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(torch, v) for v in obj)
    return obj
