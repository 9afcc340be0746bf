"""The GCP provider: Cloud TPU VMs, pod slices and queued resources through google-cloud-tpu (``tpu_v2``), or,
with ``gcp.api: compute``, TPU7x and single-host v5p/v6e through Compute Engine (google-cloud-compute).

``GcpProvider`` is the provider contract (:mod:`tpuft.providers.base`) put together from one part per concern:
the API plumbing and names (:mod:`.api`; :mod:`.compute_api`), the capacity itself (:mod:`.nodes`: nodes and
queued resources; :mod:`.compute_slices`: instance templates, workload policies, managed instance groups), the
bucket (:mod:`.buckets`), SSH access with host keys pinned from the API's guest attributes and the key in the
metadata unless OS Login is on (:mod:`.access`), and the short-lived worker address cache that spares ``exec``
an API round trip (:mod:`.cache`). Everything above the capacity is the same for both APIs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuft.core.accelerators import AcceleratorType, lookup
from tpuft.core.errors import UsageError
from tpuft.core.records import Cluster, Progress, State
from tpuft.providers.gcp import access, buckets
from tpuft.providers.gcp.api import GcpError, TpuApi
from tpuft.providers.gcp.cache import WorkerCache
from tpuft.providers.gcp.nodes import BAD_STATES, QUEUED_FAILED, TpuNodes

if TYPE_CHECKING:
    from tpuft.config import ClusterConfig
    from tpuft.fleet.ssh import SshFleet, SshSettings


class GcpProvider:
    name = "gcp"
    CACHE_SECONDS = WorkerCache.CACHE_SECONDS

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.gcp = config.gcp
        self.target = config.gcp.worker_device
        self.project = str(self.gcp.project)
        self.zone = str(self.gcp.zone)
        self.accelerator: AcceleratorType = lookup(config.accelerator)
        self.compute = self.gcp.api == "compute"
        if self.compute:
            from tpuft.providers.gcp.compute_api import ComputeApi
            from tpuft.providers.gcp.compute_slices import ComputeSlices

            self.api: TpuApi | ComputeApi = ComputeApi(
                self.project,
                self.zone,
                config.name,
                self.gcp.slices,
                self.gcp.compute_api_endpoint,
                self.gcp.timeout,
            )
            self.nodes: TpuNodes | ComputeSlices = ComputeSlices(self.api, self.gcp, self.accelerator)
        else:
            self.api = TpuApi(
                self.project,
                self.zone,
                config.name,
                self.gcp.slices,
                self.gcp.tpu_api_endpoint,
                self.gcp.timeout,
            )
            self.nodes = TpuNodes(self.api, self.gcp, self.accelerator)

    @property
    def cache(self) -> WorkerCache:
        """Built on each use, like ``state_dir()``: the folder follows ``$TPUFT_HOME`` as it is now."""
        return WorkerCache(self.state_dir() / "cluster.json")

    @property
    def pins(self) -> access.HostKeyPins:
        if isinstance(self.nodes, TpuNodes):
            api = self.nodes.api
            ask = lambda node_id, workers: access.tpu_host_keys(api, node_id, workers)  # noqa: E731
        else:
            ask = self.nodes.host_keys
        return access.HostKeyPins(self.api, self.cache, self.known_hosts_path, self.node_ids(), ask)

    # -- names and places -----------------------------------------------------------------------------------
    @property
    def tpu(self) -> TpuNodes:
        """The Cloud TPU API's nodes (``gcp.api: tpu``): what the TPU-only verbs and tests reach."""
        if not isinstance(self.nodes, TpuNodes):
            raise UsageError(f"cluster {self.config.name} is made through Compute Engine (gcp.api: compute)")
        return self.nodes

    def client(self) -> Any:
        return self.tpu.api.client()

    def node_ids(self) -> list[str]:
        """Each slice's node (Cloud TPU API) or instance/group (Compute Engine) name."""
        return self.api.slice_ids()

    def node_path(self, node_id: str) -> str:
        return self.tpu.api.node_path(node_id)

    def node_spec(self) -> Any:
        return self.tpu.node_spec()

    @property
    def parent(self) -> str:
        return self.tpu.api.parent

    def state_dir(self) -> Path:
        from tpuft.core.paths import tpuft_home

        return tpuft_home() / "gcp" / self.project / self.zone / self.config.name

    def storage_url(self) -> str:
        return self.bucket_url

    def venv_cache(self) -> str:
        """Commands run from HOME on the workers and argv gets no ``~`` expansion: make ``~/x`` plain
        ``x``."""
        cache = self.gcp.venv_cache
        return cache[2:] if cache.startswith("~/") else cache

    def python(self) -> str:
        return self.gcp.python

    @property
    def bucket_url(self) -> str:
        return buckets.default_bucket_url(self.config.bucket, self.project)

    @property
    def region(self) -> str:
        return buckets.region_of(self.zone)

    @property
    def known_hosts_path(self) -> Path:
        """Per cluster, not ~/.ssh/known_hosts: a recreated node may reuse an address with new keys."""
        return self.state_dir() / "known_hosts"

    @property
    def _cache_path(self) -> Path:
        return self.cache.path

    # -- verbs ----------------------------------------------------------------------------------------------
    def create(self, progress: Progress | None = None) -> tuple[Cluster, bool]:
        existing = self.get()
        if existing.state != State.NOT_FOUND:
            self._check_reusable(existing)
            buckets.ensure_bucket(self.bucket_url, self.project, self.region, existing, progress)
            return existing, False
        if isinstance(self.nodes, TpuNodes):
            if self.gcp.queued:
                self.nodes.create_queued(progress)
            else:
                self.nodes.create_node(progress)
        else:
            self.nodes.create(progress)
        cluster = self.get()
        if cluster.state != State.READY:
            raise GcpError(
                f"TPU {self.config.name} ended up {cluster.state} instead of READY",
                hint="See: tpuft status; then tpuft delete --yes && tpuft create",
            )
        buckets.ensure_bucket(self.bucket_url, self.project, self.region, cluster, progress)
        return cluster, True

    def plan(self) -> dict[str, Any]:
        """What ``create`` would ask for, built on this machine without an API call or credentials
        (``--dry-run``): the request as it would be sent, the node(s) it makes, and the bucket."""
        where = {"project": self.project, "zone": self.zone, "api": self.gcp.api, "nodes": self.node_ids()}
        rest = {"bucket": self.bucket_url, "bucket_region": self.region, "venv_cache": self.venv_cache()}
        if not isinstance(self.nodes, TpuNodes):
            shape = self.nodes.shape
            compute = {
                "machine_type": shape.machine_type,
                "hosts_per_slice": shape.hosts,
                "topology": shape.topology,
                "image": self.gcp.image or shape.image,
            }
            requests = [
                {"rpc": r.rpc, "parent": r.where, "body": r.body()} for r in self.nodes.create_requests()
            ]
            return {**where, **compute, "requests": requests, **rest}
        request = self.nodes.create_request()
        return {
            **where,
            "queued_resource": self.config.name if self.gcp.queued else None,
            "request": {
                "rpc": request.rpc,
                "parent": request.parent,
                request.id_field: request.id,
                "body": request.body(),
            },
            **rest,
        }

    def _check_reusable(self, cluster: Cluster) -> None:
        wanted = self.nodes.wanted_shape()
        if cluster.details.get("shape") and cluster.details["shape"] != wanted:
            raise UsageError(
                f"TPU {self.config.name} exists in {self.zone} as {cluster.details['shape']}, "
                f"the cluster file asks for {wanted}",
                hint="Delete it first (tpuft delete --yes), or use another cluster name.",
            )
        if cluster.state in BAD_STATES or cluster.state in QUEUED_FAILED:
            problem = cluster.details.get("problem", "")
            raise UsageError(
                f"TPU {self.config.name} exists but is {cluster.state}{': ' + problem if problem else ''}",
                hint="Delete and recreate it: tpuft delete --yes && tpuft create",
            )
        if cluster.state != State.READY:
            raise UsageError(
                f"TPU {self.config.name} exists and is {cluster.state}",
                hint="Wait for it (tpuft status) or delete it (tpuft delete --yes).",
            )

    def get(self) -> Cluster:
        cluster, identity = self.nodes.describe(self.name, self.config.accelerator, self.bucket_url)
        if identity is not None:
            self.cache.remember(cluster, identity)
        return cluster

    def forget(self) -> None:
        self.cache.forget()

    def cached(self) -> Cluster | None:
        """The cluster as last seen, if READY and seen in the last few minutes; None means: ask the API."""
        return self.cache.cached(self.config.name, self.name)

    def delete(self, progress: Progress | None = None) -> bool:
        self.known_hosts_path.unlink(missing_ok=True)  # the next node may reuse these addresses
        self.forget()
        return self.nodes.delete(progress)

    # -- reaching the workers ------------------------------------------------------------------------------
    def ssh_settings(self) -> SshSettings:
        return access.ssh_settings(self.config.ssh, self.known_hosts_path)

    def prepare(self, cluster: Cluster) -> None:
        """Make this machine able to log in: the key pair exists and (without OS Login) its public half is in
        the node's metadata, as gcloud does it; and the workers' host keys are pinned from the API. Both are
        remembered with the cluster, so each costs API calls once per node."""
        from tpuft.providers.ssh_keys import ensure_key

        settings = self.ssh_settings()
        public = ensure_key(settings.key_file, settings.user)
        entry = f"{settings.user}:{public.strip()}"
        record = self.cache.read() or {}
        if not self.config.ssh.os_login and record.get("key") != entry:
            self.ensure_key_in_metadata(settings.user, public)
            if record:
                self.cache.write({**record, "key": entry})
        self.pins.pin(cluster, settings.port)
        self._login = None if self.config.ssh.os_login else entry

    def remember_exec_plan(self, config_path: str) -> None:
        """After ``prepare`` and a fleet that reached the workers: what the next cold ``exec`` with this
        cluster file needs (:mod:`.exec_plan`). A file with ``worker_env`` gets none (its values are read at
        validation)."""
        from tpuft.providers.gcp import exec_plan

        if self.config.worker_env or not hasattr(self, "_login"):
            exec_plan.forget(config_path)
            return
        exec_plan.remember(config_path, self.state_dir(), self.ssh_settings(), self.config.name, self._login)

    def ensure_key_in_metadata(self, user: str, public_key: str) -> bool:
        if isinstance(self.nodes, TpuNodes):
            return access.ensure_key_in_metadata(self.nodes.api, user, public_key)
        return self.nodes.ensure_key_in_metadata(f"{user}:{public_key.strip()}")

    def fetch_host_keys(self, cluster: Cluster, nodes: list[list[Any]] | None = None) -> list[list[str]]:
        return self.pins.fetch(cluster, nodes)

    def fleet(self, cluster: Cluster) -> SshFleet:
        from tpuft.fleet.ssh import SshFleet

        return SshFleet(cluster.workers, self.ssh_settings())
