"""How the PyTorch/XLA trainer's replicas stay in step: the replication strategies (which average gradients
and sum numbers across replicas), the RNG seed each replica draws from, and the weight digest that shows they
all ended with identical weights.

- local CPU pod: one process per worker, over its PJRT CPU devices (one, or an SPMD mesh of
  ``local.devices_per_worker``: :mod:`tpuft.worker.torch_xla.sharding`); gradients (and the step's loss and
  token count, in the same buffer) are averaged with torch.distributed over gloo, worker 0 being the
  rendezvous (:class:`Gloo`). With ``local.slices`` the replicas are the workers slice by slice (replica
  ``slice * hosts + host``, as on TPU slices, so each one reads the data shard it would there) and the
  reduction is hierarchical like Multislice's: within each slice, then across the slices between the hosts of
  one index (the DCN's part).
- TPU host: one process per local chip (``torch_xla.launch``); gradients are averaged with XLA collectives
  (``xm.reduce_gradients``) across every chip of every host (:class:`XlaCollectives`).
- TPU with ``train.sharding: fsdp``, or several slices (Multislice, over ``HybridMesh``:
  :mod:`tpuft.worker.torch_xla.multislice`): one SPMD program per host over every chip (:class:`SpmdHosts`).

Imports nothing heavy at module level: :func:`rng_seed` is tested without torch.
"""

from __future__ import annotations

import datetime
import hashlib
import sys
import time
from collections.abc import Callable
from typing import Any

from tpuft.core.records import SliceLayout
from tpuft.worker.context import WorkerContext

COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)
"""gloo's bound on one collective (a hung peer is named sooner by its supervisor's ``train.hang_timeout``)."""


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

    def __init__(
        self, rank: int, layout: SliceLayout, coordinator: str, device: Any, startup_timeout: float
    ) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.rank, self.world, self.device = rank, layout.workers, device
        self.local_rank = 0  # one process per worker
        store = rendezvous(coordinator, rank, layout, startup_timeout)
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=self.world, timeout=COLLECTIVE_TIMEOUT
        )
        self.groups = reduction_groups(dist, layout, rank)

    def _all_reduce(self, tensor: Any) -> None:
        for group in self.groups:  # within the slice, then across the slices (or the whole world at once)
            self.dist.all_reduce(tensor, group=group)

    def reduce_gradients(self, params: list[Any], optimizer: Any, extras: Any) -> Any:
        import torch

        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads] + [extras.reshape(-1).to(grads[0].dtype)])
        host = flat.cpu()  # runs the forward/backward graph
        self._all_reduce(host)
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
        self._all_reduce(host)
        return host

    def close(self) -> None:
        self.dist.destroy_process_group()


class SpmdHosts:
    """TPU with ``train.sharding: fsdp``: one SPMD program over every chip of every host. Each host feeds its
    slice of the global batch; the compiler inserts the gradient reductions, so there is nothing to average,
    and a sum over the global batch is already global."""

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


def make_replicas(ctx: WorkerContext, *, tpu: bool, spmd: bool, device: Any, startup_timeout: float) -> Any:
    """The strategy for where this process runs (see the module docstring)."""
    if tpu and spmd:
        return SpmdHosts()
    if tpu:
        return XlaCollectives()
    if ctx.num_workers > 1:
        return Gloo(ctx.worker_id, ctx.layout, ctx.coordinator, device, startup_timeout)
    return Single()


def reduction_groups(dist: Any, layout: SliceLayout, rank: int) -> list[Any]:
    """The gloo groups this rank all-reduces over, in turn: its slice's hosts, then the hosts of its index in
    every slice (each sum of the first is then summed across slices, as Multislice's DCN reduction does); a
    stage of one rank is left out, and a stage that spans every rank is the default group (None). Every rank
    creates every group (torch.distributed's rule), so all ranks call this with the same layout."""
    stages = [
        [[layout.index_of(s, h) for h in range(layout.hosts)] for s in range(layout.slices)],
        [[layout.index_of(s, h) for s in range(layout.slices)] for h in range(layout.hosts)],
    ]
    groups: list[Any] = []
    for ranks_per_group in stages:
        size = len(ranks_per_group[0])
        if size == 1:
            continue
        if size == layout.workers:
            groups.append(None)
            continue
        mine, _ = dist.new_subgroups_by_enumeration(ranks_per_group)
        groups.append(mine)
    return groups or [None]


def rendezvous(
    coordinator: str,
    rank: int,
    layout: SliceLayout,
    timeout_s: float,
    say: Callable[[str], None] | None = None,
) -> Any:
    """The gloo group's store (a TCPStore at ``coordinator``, rank 0 serving it) once every worker has joined;
    bounded by ``train.startup_timeout``: past it, a RuntimeError names the workers that never came ("slice 1
    host 0 (worker 1)"). Every rank waits and reports every minute, so the first log of any worker shows who
    is missing."""
    from torch.distributed import TCPStore

    from tpuft.run.startup import names as worker_names

    say = say or (lambda line: print(f"[tpuft] {line}", file=sys.stderr, flush=True))
    host, port = coordinator.rsplit(":", 1)
    deadline = time.monotonic() + timeout_s
    limit = datetime.timedelta(seconds=max(1.0, timeout_s))
    try:
        store = TCPStore(
            host, int(port), layout.workers, is_master=rank == 0, timeout=limit, wait_for_workers=False
        )
    except (
        RuntimeError,
        TimeoutError,
    ) as exc:  # the client retries until the limit; the master never came up
        raise RuntimeError(
            f"{layout.name(rank)}: the run's rendezvous at {coordinator} (served by "
            f"{layout.name(0)}) did not answer within train.startup_timeout ({timeout_s:g} s): {exc}"
        ) from exc
    store.set(f"tpuft/joined/{rank}", "1")
    reported = time.monotonic()
    while True:
        missing = [r for r in range(layout.workers) if not store.check([f"tpuft/joined/{r}"])]
        if not missing:
            return store
        now = time.monotonic()
        names = worker_names(layout, missing)
        if now >= deadline:
            raise RuntimeError(
                f"{len(missing)} of {layout.workers} workers never joined the run's rendezvous within "
                f"train.startup_timeout ({timeout_s:g} s): {names}"
            )
        if now - reported >= 60:
            say(
                f"waiting for {names} to join the rendezvous ({deadline - now:.0f} s left of "
                "train.startup_timeout)"
            )
            reported = now
        time.sleep(0.2)


def check_same_start(replicas: Any, torch: Any, device: Any, start_step: int) -> None:
    """Every replica picks the latest complete checkpoint itself: make sure they all picked the same one (a
    replica that went on from another step would silently train different weights)."""
    if replicas.world == 1 or getattr(replicas, "implicit", False):
        return
    parts = [start_step % 4096, start_step // 4096]  # int32-safe sums over thousands of replicas
    total = replicas.sum(torch.tensor(parts, dtype=torch.int32, device=device))
    if [int(v) for v in total] != [v * replicas.world for v in parts]:
        raise RuntimeError(
            f"replica {replicas.rank} resumes from step {start_step}, but not every replica does: "
            "the workers see different checkpoints"
        )


def any_flag(replicas: Any, torch: Any, device: Any, flag: bool) -> bool:
    """Any replica's ``flag``, on every replica: one all-reduce of one number (none for one replica, or for
    one SPMD program, whose hosts run the same program)."""
    if replicas.world == 1 or getattr(replicas, "implicit", False):
        return flag
    return float(replicas.sum(torch.tensor([1.0 if flag else 0.0], device=device))[0]) > 0


def rng_seed(seed: int, replica: int, step: int) -> int:
    """The RNG seed of ``replica`` from ``step`` on: a hash, so that nearby (seed, replica, step) give
    unrelated streams; below 2**63, which every generator takes."""
    digest = hashlib.sha256(f"tpuft-rng {seed} {replica} {step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def params_digest(state: dict[str, Any]) -> str:
    """sha256 over every tensor in name order, each framed by its name, dtype and shape (so that neither a
    renamed, a reshaped nor a differently split tensor can give the same bytes): equal digests mean identical
    weights."""
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
