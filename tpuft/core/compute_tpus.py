"""TPUs as Compute Engine sells them (``gcp.api: compute``): accelerator type -> machine type, hosts, the
workload policy's topology and the boot image.

Why a table: ``create --dry-run`` shows the bodies and a bad combination is refused at its line before any
call. Sources (stored copies; no live web here): docs.cloud.google.com/tpu/docs/tpu7x (a TPU7x VM holds four
chips); the machine types ``tpu7x-standard-1t``/``-4t``, ``ct6e-standard-1t``/``-4t``/``-8t`` and
``ct5p-hightpu-4t`` as Google's xpk (``system_characteristics.py``) and SkyPilot's Compute Engine TPU code
name them; TPU7x multi-host topologies 2x2x2 .. 8x16x16 on ``tpu7x-standard-4t`` hosts (SkyPilot's
``mig_utils.py``, and libtpu's own topology list); the images (project ``ubuntu-os-accelerator-images``:
``ubuntu-accel-2404-amd64-tpu-tpu7x`` for TPU7x, ``ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e`` for v5p and
v6e). Compute Engine makes v5p and v6e as single-host instances only here: their multi-host slices are the
Cloud TPU API's (or GKE's), and tpuft refuses them on ``gcp.api: compute`` naming the one that works.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuft.core.accelerators import AcceleratorType
from tpuft.core.errors import UsageError

IMAGE_PROJECT = "ubuntu-os-accelerator-images"
IMAGE_FAMILIES = {
    "tpu7x": "ubuntu-accel-2404-amd64-tpu-tpu7x",
    "v6e": "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e",
    "v5p": "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e",
}
MACHINE_TYPES: dict[str, dict[int, str]] = {
    "tpu7x": {1: "tpu7x-standard-1t", 4: "tpu7x-standard-4t"},
    "v6e": {1: "ct6e-standard-1t", 4: "ct6e-standard-4t", 8: "ct6e-standard-8t"},
    "v5p": {4: "ct5p-hightpu-4t"},
}
"""Generation -> chips per VM -> machine type."""
MULTI_HOST = frozenset({"tpu7x"})
"""Generations whose multi-host slices Compute Engine makes (a MIG with a workload policy)."""


@dataclass(frozen=True)
class ComputeShape:
    machine_type: str
    hosts: int
    chips_per_host: int
    topology: str
    """The slice's chips as the workload policy's ``acceleratorTopology`` writes them (``2x2x2``)."""
    image_family: str

    @property
    def image(self) -> str:
        return f"projects/{IMAGE_PROJECT}/global/images/family/{self.image_family}"


def compute_types() -> list[str]:
    """Every accelerator type the Compute Engine path makes, for messages."""
    from tpuft.core.accelerators import GENERATIONS, lookup

    found = []
    for name, generation in GENERATIONS.items():
        for size in generation.sizes:
            accelerator = lookup(f"{name}-{size}")
            if _problem(accelerator) is None:
                found.append(accelerator.name)
    return found


def _problem(accelerator: AcceleratorType) -> str | None:
    generation = accelerator.generation.name
    types = MACHINE_TYPES.get(generation)
    if types is None:
        return (
            f"{accelerator.name}: Compute Engine makes no {generation} TPUs; set gcp.api: tpu (the Cloud TPU "
            "API)"
        )
    if accelerator.hosts > 1 and generation not in MULTI_HOST:
        return (
            f"{accelerator.name} is a multi-host {generation} slice, which Compute Engine does not make (its "
            f"{generation} machine types are single hosts: {', '.join(types.values())}); set gcp.api: tpu"
        )
    if accelerator.chips_per_host not in types:
        return f"{accelerator.name}: no {generation} machine type holds {accelerator.chips_per_host} chips"
    return None


def compute_problem(accelerator: AcceleratorType) -> str | None:
    """Why ``gcp.api: compute`` cannot make ``accelerator``, naming what it can; None when it can."""
    problem = _problem(accelerator)
    if problem is None:
        return None
    same = [t for t in compute_types() if t.startswith(f"{accelerator.generation.name}-")]
    return f"{problem}. Compute Engine makes: {', '.join(same or compute_types())}"


def compute_shape(accelerator: AcceleratorType) -> ComputeShape:
    problem = compute_problem(accelerator)
    if problem is not None:
        raise UsageError(problem)
    topology = accelerator.topology().name.split(":", 1)[1]
    return ComputeShape(
        MACHINE_TYPES[accelerator.generation.name][accelerator.chips_per_host],
        accelerator.hosts,
        accelerator.chips_per_host,
        topology,
        IMAGE_FAMILIES[accelerator.generation.name],
    )
