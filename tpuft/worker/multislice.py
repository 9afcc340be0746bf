"""Multislice on the worker: the runtime's own cross-slice variables, set in the trainer before any framework
loads.

JAX and PyTorch/XLA join the slices of a Multislice job over the data-centre network when their process has
``MEGASCALE_COORDINATOR_ADDRESS`` (slice 0 host 0, on ``MEGASCALE_PORT``), ``MEGASCALE_NUM_SLICES`` and
``MEGASCALE_SLICE_ID``; they read them when the runtime initializes, so they must be in ``os.environ`` before
the backend's first import of it. The controller only says how many slices the launched workers are
(``TPUFT_NUM_SLICES``) and, where several workers share one machine (the local pod), which free port stands in
for the fixed one (``TPUFT_MEGASCALE_PORT``); everything else follows from the worker's rank (workers are
numbered slice by slice).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from tpuft.core.errors import UsageError
from tpuft.core.ports import MEGASCALE_PORT
from tpuft.host.launch_env import PORT_ENV, TARGET_ENV
from tpuft.worker.context import WorkerContext

STARTUP_FLAG = "--megascale_topology_discovery_timeout"
LIBTPU_ARGS = "LIBTPU_INIT_ARGS"


def megascale_env(ctx: WorkerContext, environ: MutableMapping[str, str]) -> dict[str, str]:
    """The MEGASCALE variables of this worker ({} on one slice). Slice 0 host 0 is rank 0, whose address is
    the in-run coordinator's host (``TPUFT_COORDINATOR``)."""
    if ctx.num_slices <= 1:
        return {}
    if ctx.num_workers % ctx.num_slices:
        raise UsageError(
            f"TPUFT_NUM_SLICES={ctx.num_slices} does not divide the {ctx.num_workers} launched workers "
            "into equal slices"
        )
    host = ctx.coordinator.rsplit(":", 1)[0]
    port = environ.get(PORT_ENV) or str(MEGASCALE_PORT)
    return {
        "MEGASCALE_COORDINATOR_ADDRESS": f"{host}:{port}",
        "MEGASCALE_NUM_SLICES": str(ctx.num_slices),
        "MEGASCALE_SLICE_ID": str(ctx.slice_id),
        "MEGASCALE_PORT": port,
    }


def bound_tpu_startup(timeout_s: float, environ: MutableMapping[str, str]) -> str:
    """Bound libtpu's wait for every host of every slice (its MegaScale topology discovery, the runtime's one
    rendezvous under JAX and PyTorch/XLA alike) by ``train.startup_timeout``; a flag the user already put in
    ``LIBTPU_INIT_ARGS`` wins. Returns the flag as set."""
    args = environ.get(LIBTPU_ARGS, "")
    if STARTUP_FLAG in args:
        return next(part for part in args.split() if part.startswith(STARTUP_FLAG))
    flag = f"{STARTUP_FLAG}={max(1, round(timeout_s))}s"
    environ[LIBTPU_ARGS] = f"{args} {flag}".strip()
    return flag


def apply_megascale_env(
    ctx: WorkerContext, environ: MutableMapping[str, str] | None = None, startup_timeout: float | None = None
) -> str | None:
    """Set the MEGASCALE variables in this process (before any framework import) and, on TPU hosts, libtpu's
    start-up bound from ``startup_timeout``; return the line the trainer logs about it; None on one slice,
    where nothing is set."""
    environ = os.environ if environ is None else environ
    values = megascale_env(ctx, environ)
    if not values:
        return None
    environ.update(values)
    layout = ctx.layout
    line = (
        f"multislice: slice {ctx.slice_id} of {layout.slices}, host {layout.host_of(ctx.worker_id)} of "
        f"{layout.hosts}, coordinator {values['MEGASCALE_COORDINATOR_ADDRESS']}"
    )
    if startup_timeout is not None and environ.get(TARGET_ENV) == "tpu":
        line += f"; libtpu {bound_tpu_startup(startup_timeout, environ)}"
    return line
