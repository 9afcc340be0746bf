"""--dry-run of create, setup, train and up: what the verb would do, worked out on this machine alone.

No API call, no credentials, no connection to a worker: the provider builds the create request it would send
(:meth:`tpuft.providers.base.Provider.plan`), the backend says which workers run what (its launch plan for the
cluster's shape as the cluster file states it) and what venv ``setup`` builds, and the price comes from the
built-in catalogue through the one cost estimate ``create`` also shows
(:func:`tpuft.ops.cluster.cost_estimate`). Whether the cluster exists already is not known without asking the
API, so the plan is the one for a cluster that does not.

Environment variables are named, never valued: the cluster file's ``worker_env`` may carry a token
(``HF_TOKEN``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from tpuft.backends.base import get_backend
from tpuft.backends.spec import LOCAL_DEVICES_ENV, ClusterShape
from tpuft.config import ClusterConfig, Loaded, RecipeConfig
from tpuft.config.tracking_env import tracking_spec
from tpuft.core.accelerators import lookup
from tpuft.ops.cluster import cost_estimate
from tpuft.providers import get_provider

VERBS = ("create", "setup", "train", "up")

TRAINER_ENV = (
    "TPUFT_RUN_ID",
    "TPUFT_RUN_DIR",
    "TPUFT_WORKER_ID",
    "TPUFT_NUM_WORKERS",  # ops/lifecycle.py: supervisor_env
    "TPUFT_COORDINATOR",
    "TPUFT_PEERS",
    "TPUFT_NODE",
    "TPUFT_NUM_SLICES",
    "TPUFT_TARGET",  # ops/trainer_env.py: trainer_env
    "PYTHONPATH",
    "PYTHONUNBUFFERED",
)
"""tpuft's own variables in every supervisor's and trainer's environment (tests/ops/test_dry_run.py holds this
list to the names those two functions set)."""


@dataclass
class WorkerRole:
    worker: int
    runs: str
    """What this worker does in the run: the trainer (with its rank), or nothing."""


@dataclass
class Price:
    per_hour: float | None
    """USD, on-demand list price of the whole cluster (all slices); None: no public price (or the local
    pod)."""
    described: str
    steps: int | None = None
    run_note: str = ""
    """The whole run's price: steps x an estimated step time where one is known; else why it is per hour
    only."""


@dataclass
class Plan:
    verb: str
    cluster: str
    provider: str
    accelerator: str
    chips: int
    workers: int
    create: dict[str, Any]
    """The provider's plan: the create request and node ids (gcp) or the worker folders (local), and the
    bucket."""
    price: Price
    recipe: str | None = None
    backend: str | None = None
    venv: str | None = None
    requirements: list[str] = field(default_factory=list)
    roles: list[WorkerRole] = field(default_factory=list)
    env: dict[str, list[str]] = field(default_factory=dict)
    """Per process kind (``setup``, ``trainer``): the NAMES of the variables it gets."""
    layout: str | None = None
    """The run's devices: workers x devices each (and replicas x partitions where the recipe partitions the
    model)."""

    def as_json(self) -> dict[str, Any]:
        return {"dry_run": True, **asdict(self)}


def plan(config: ClusterConfig, verb: str, recipe: Loaded[RecipeConfig] | None = None) -> Plan:
    """The plan of ``verb`` (one of :data:`VERBS`); ``recipe`` for setup, train and up. A recipe that does not
    fit the cluster's shape is refused here as it would be by the verb (a located :class:`ConfigError`)."""
    provider = get_provider(config)
    accelerator = lookup(config.accelerator)
    estimate = cost_estimate(config)
    local = config.provider == "local"
    spot = config.gcp.spot if not local else False
    price = Price(
        per_hour=None if local else estimate.per_hour,
        described="the local pod runs on this machine: no price"
        if local
        else estimate.describe(accelerator.name, spot),
    )
    result = Plan(
        verb=verb,
        cluster=config.name,
        provider=config.provider,
        accelerator=accelerator.name,
        chips=0 if local else estimate.chips,
        workers=config.num_workers,
        create=provider.plan(),
        price=price,
    )
    if recipe is None or verb == "create":
        return result
    _add_recipe(result, config, recipe, provider.python(), provider.venv_cache())
    return result


def _add_recipe(
    result: Plan, config: ClusterConfig, recipe: Loaded[RecipeConfig], python: str, cache: str
) -> None:
    from tpuft.ops.preflight import check_against_cluster

    value = recipe.value
    shape = config.shape()
    if result.verb != "setup":
        check_against_cluster(recipe, shape)
    backend = get_backend(value.backend.kind)
    launch = backend.plan(value, shape)
    spec = backend.env_spec(value.backend, shape.target, python)
    result.recipe = value.name
    result.backend = value.backend.kind
    result.venv = f"{cache if cache.startswith('/') else '~/' + cache}/{spec.key}"  # gcp: HOME-relative
    result.requirements = list(spec.requirements) + [f"{entry} (--no-deps)" for entry in spec.no_deps]
    if value.report.trackers:  # report.to: the chief also gets the tracker sidecar's own venv
        result.requirements += [
            f"{entry} (tracking venv, on the chief only)" for entry in tracking_spec(python).requirements
        ]
    ranks = {worker: rank for rank, worker in enumerate(launch.workers)}
    trainer = " ".join(("<venv>/bin/python", *launch.argv))
    for index in range(result.workers):
        if index in ranks:
            runs = f"setup: build the venv; train: {trainer} (rank {ranks[index]} of {len(launch.workers)})"
        else:
            runs = "nothing: the backend's launch plan leaves this worker out"
        result.roles.append(WorkerRole(index, runs if result.verb != "setup" else runs.split("; train:")[0]))
    result.env = {"setup": sorted(config.worker_env)}
    if result.verb != "setup":
        result.layout = device_layout(shape, launch.env, getattr(value.backend, "num_partitions", None))
    if result.verb != "setup":
        result.env["trainer"] = sorted({*config.worker_env, *TRAINER_ENV, *launch.env})
        result.price.steps = value.train.steps
        if result.price.per_hour is not None:
            result.price.run_note = (
                f"{value.train.steps} steps; no step-time estimate for this recipe, so the "
                "run's total is not estimated: per hour only"
            )


def device_layout(shape: ClusterShape, launch_env: dict[str, str], partitions: int | None) -> str:
    """``2 worker(s) x 2 device(s) = 4 devices: 2 replicas x 2 partitions``. A local worker exposes the
    devices its backend's launch plan asks for (``TPUFT_LOCAL_DEVICES``), one where the backend asks for
    none."""
    if shape.target == "tpu":
        per_worker, what = shape.chips_per_host * shape.devices_per_chip, "TPU device(s)"
    else:
        per_worker, what = int(launch_env.get(LOCAL_DEVICES_ENV, "1")), "CPU device(s)"
    devices = shape.hosts * per_worker
    text = f"{shape.hosts} worker(s) x {per_worker} {what} = {devices} devices"
    if partitions:
        text += f": {max(1, devices // partitions)} replica(s) x {partitions} partition(s)"
    return text


def lines(result: Plan) -> list[str]:
    """The plan as text for a terminal (plain: no markup; the request body is JSON)."""
    create = result.create
    out = [
        f"dry run of tpuft {result.verb}: nothing is created, called or connected to",
        f"cluster {result.cluster} ({result.provider}, {result.accelerator}): {result.workers} worker(s)",
    ]
    if result.provider == "gcp":
        out += _gcp_create_lines(create)
    else:
        out.append(
            f"  create (unless it exists): {len(create['worker_folders'])} worker folder(s) under "
            f"{create['state_dir']}"
        )
        out += [f"    {folder}" for folder in create["worker_folders"]]
    out.append(
        f"  run storage: {create['bucket']}"
        + (f" (in {create['bucket_region']})" if "bucket_region" in create else "")
    )
    out.append(f"  price: {result.price.described}")
    if result.backend is None:
        return out
    out.append(f"recipe {result.recipe}: backend {result.backend}")
    out.append(f"  venv: {result.venv}")
    out += [f"    {requirement}" for requirement in result.requirements]
    if result.layout:
        out.append(f"  device layout: {result.layout}")
    out += [f"  worker {role.worker}: {role.runs}" for role in result.roles]
    for kind, names in result.env.items():
        out.append(f"  environment of the {kind} processes (names only): {', '.join(names) or '-'}")
    if result.price.run_note:
        out.append(f"  the run: {result.price.run_note}")
    return out


def _gcp_create_lines(create: dict[str, Any]) -> list[str]:
    """What ``create`` sends: the Cloud TPU API's one request, or Compute Engine's inserts in order."""
    if create.get("api") == "compute":
        out = [
            f"  create (unless it exists), through Compute Engine in {create['project']}/{create['zone']}: "
            f"{create['hosts_per_slice']} x {create['machine_type']} per slice (topology "
            f"{create['topology']}, image {create['image']}) -> slice(s) {', '.join(create['nodes'])}"
        ]
        requests = create["requests"]
    else:
        what = (
            "queued resource " + str(create["queued_resource"]) if create["queued_resource"] else "TPU node"
        )
        out = [
            f"  create (unless it exists): {what} in {create['project']}/{create['zone']} -> "
            f"node(s) {', '.join(create['nodes'])}"
        ]
        requests = [create["request"]]
    for request in requests:
        out.append(f"  request: {request['rpc']} {request['parent']}")
        out += ["    " + text for text in json.dumps(request["body"], indent=2, sort_keys=True).splitlines()]
    return out
