"""The GCP provider: Cloud TPU VMs, pod slices and queued resources through google-cloud-tpu (``tpu_v2``).

The node's ``network_endpoints`` are the workers, in order (index i is ``--worker i``). The API's own state words
(READY, CREATING, PREEMPTED, ...; ACCEPTED, PROVISIONING, ACTIVE, FAILED, SUSPENDED for queued resources) are passed
through. Every call goes through ``_call``: transient errors (UNAVAILABLE, 429, 500) are retried with backoff, the
others become one line naming the project, zone and call, with the likely fix.

The client is built lazily (the CLI never imports Google's libraries at start-up). ``gcp.tpu_api_endpoint`` (or
``$TPUFT_TPU_API_ENDPOINT``) points it at a private endpoint; anonymous credentials are used only for a loopback
``http://`` endpoint, which is how the tests talk to a fake TPU API server.

Workers' SSH host keys are pinned from the API, never learnt from whatever answers on port 22: each TPU VM's guest
agent publishes its host keys as guest attributes (namespace ``hostkeys``), which ``GetGuestAttributes`` returns, the
way ``gcloud compute tpus tpu-vm ssh`` checks them. ``prepare`` writes them to ``state_dir()/known_hosts`` for the
addresses the fleet connects to, and refreshes that file from the API only when the node (its ``id``) or the
addresses change; the SSH fleet refuses a host whose key is not the pinned one.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tpuft.accelerators import AcceleratorType, lookup
from tpuft.config import ClusterConfig, parse_duration
from tpuft.errors import TpuftError, UsageError
from tpuft.records import Cluster, Progress, State, Worker

if TYPE_CHECKING:
    from tpuft.fleet.ssh import SshFleet, SshSettings

T = TypeVar("T")

POLL_SECONDS = float(os.environ.get("TPUFT_GCP_POLL_SECONDS", "5"))
"""How often to ask about a long-running operation or a queued resource (tests set it low)."""
RETRY_BASE_S = float(os.environ.get("TPUFT_GCP_RETRY_BASE_S", "1"))
"""First back-off after a transient API error; doubles up to 30 s, 6 tries in all."""
HOSTKEY_WAIT_S = float(os.environ.get("TPUFT_GCP_HOSTKEY_WAIT_S", "300"))
"""How long a fresh VM's guest agent may take to publish its SSH host keys before we refuse (tests set it low)."""
HOSTKEY_NAMESPACE = "hostkeys"
_KEY_TYPE = re.compile(r"(ssh|ecdsa|sk)-[a-z0-9@.-]+")
_KEY_BLOB = re.compile(r"[A-Za-z0-9+/]+={0,2}")
CREATE_TIMEOUT_S = 3600.0
BAD_STATES = {"PREEMPTED", "TERMINATED", "STOPPED", "STOPPING", "DELETING", "REPAIRING", "HIDING", "HIDDEN", "UNHIDING"}
QUEUED_FAILED = {"FAILED", "SUSPENDED", "SUSPENDING"}

_HINTS = {
    "NotFound": "check gcp.project and gcp.zone (and that the TPU API is enabled: gcloud services enable tpu.googleapis.com)",
    "PermissionDenied": "your account needs roles/tpu.admin in the project (gcloud auth application-default login?)",
    "Forbidden": "your account needs roles/tpu.admin in the project (gcloud auth application-default login?)",
    "ResourceExhausted": "no quota or no capacity for this shape here: try another zone, spot, or gcp.queued: true",
    "TooManyRequests": "the API is rate-limiting this project: wait a minute and try again",
    "InvalidArgument": "the API refused the request: check the accelerator type, runtime version and zone",
    "BadRequest": "the API refused the request: check the accelerator type, runtime version and zone",
    "Unauthenticated": "no valid credentials: run gcloud auth application-default login",
    "FailedPrecondition": "the resource is in a state that does not allow this call",
    "AlreadyExists": "a resource with this name exists already",
    "Conflict": "a resource with this name exists already (or is being changed): see tpuft status",
}


class GcpError(TpuftError):
    pass


def _loopback_http(endpoint: str) -> bool:
    return endpoint.startswith(("http://127.", "http://localhost", "http://[::1]"))


class GcpProvider:
    name = "gcp"

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.gcp = config.gcp
        self.target = config.gcp.worker_device
        self.project = str(self.gcp.project)
        self.zone = str(self.gcp.zone)
        self.parent = f"projects/{self.project}/locations/{self.zone}"
        self.accelerator: AcceleratorType = lookup(config.accelerator)
        self._client: Any = None

    # -- plumbing -------------------------------------------------------------------------------------------
    @property
    def endpoint(self) -> str | None:
        return self.gcp.tpu_api_endpoint or os.environ.get("TPUFT_TPU_API_ENDPOINT") or None

    def client(self) -> Any:
        if self._client is None:
            from google.cloud import tpu_v2

            options: dict[str, Any] = {}
            credentials = None
            if self.endpoint:
                options["client_options"] = {"api_endpoint": self.endpoint}
                if _loopback_http(self.endpoint):
                    from google.auth.credentials import AnonymousCredentials

                    credentials = AnonymousCredentials()
            try:
                self._client = tpu_v2.TpuClient(transport="rest", credentials=credentials, **options)
            except Exception as exc:  # google.auth.exceptions.DefaultCredentialsError and friends
                raise GcpError(
                    f"cannot create the Cloud TPU client: {exc}",
                    hint="Log in with: gcloud auth application-default login",
                ) from None
        return self._client

    def _call(self, what: str, fn: Callable[..., T], *args: Any, missing_ok: bool = False, **kwargs: Any) -> T:
        """One API call with retries for transient errors and a clear message for the rest.
        With ``missing_ok``, NotFound is raised as it is, for callers to which absence is an answer."""
        import requests
        from google.api_core import exceptions as gexc

        transient = (gexc.ServiceUnavailable, gexc.TooManyRequests, gexc.InternalServerError, gexc.GatewayTimeout)
        for attempt in range(6):
            try:
                return fn(*args, **kwargs)
            except gexc.NotFound as exc:
                if missing_ok:
                    raise
                raise self._explain(what, exc) from None
            except transient as exc:
                if attempt == 5:
                    raise self._explain(f"{what} (after {attempt + 1} tries)", exc) from None
                time.sleep(min(RETRY_BASE_S * 2**attempt, 30.0))
            except gexc.GoogleAPICallError as exc:
                raise self._explain(what, exc) from None
            except requests.exceptions.ConnectionError as exc:
                if attempt == 5:
                    raise GcpError(
                        f"{what}: cannot reach the Cloud TPU API at {self.endpoint or 'tpu.googleapis.com'}: {exc}"
                    ) from None
                time.sleep(min(RETRY_BASE_S * 2**attempt, 30.0))
        raise AssertionError("unreachable")

    def _explain(self, what: str, exc: Exception) -> GcpError:
        kind = type(exc).__name__
        message = getattr(exc, "message", None) or str(exc)
        hint = _HINTS.get(kind, "")
        error = GcpError(f"{what} in project {self.project}, zone {self.zone} failed: {kind}: {message}", hint=hint or None)
        error.kind = kind  # type: ignore[attr-defined]
        return error

    def _wait_operation(self, what: str, operation: Any, progress: Progress | None, watch: Callable[[], str] | None) -> Any:
        """Poll a long-running operation, telling ``progress`` the resource's state while it runs."""
        from google.api_core import exceptions as gexc

        deadline = time.monotonic() + CREATE_TIMEOUT_S
        while not self._call(f"{what} (polling)", operation.done):
            if progress and watch:
                progress(watch())
            if time.monotonic() > deadline:
                raise GcpError(f"{what}: still not done after {CREATE_TIMEOUT_S:.0f}s", hint="See: tpuft status")
            time.sleep(POLL_SECONDS)
        try:
            return operation.result(timeout=60)
        except gexc.GoogleAPICallError as exc:
            raise self._explain(what, exc) from None

    # -- names ---------------------------------------------------------------------------------------------
    def node_ids(self) -> list[str]:
        if self.gcp.slices > 1:
            return [f"{self.config.name}-{i}" for i in range(self.gcp.slices)]
        return [self.config.name]

    def node_path(self, node_id: str) -> str:
        return f"{self.parent}/nodes/{node_id}"

    def queued_path(self) -> str:
        return f"{self.parent}/queuedResources/{self.config.name}"

    def state_dir(self) -> Path:
        from tpuft.paths import tpuft_home

        return tpuft_home() / "gcp" / self.project / self.zone / self.config.name

    def storage_url(self) -> str:
        return self.bucket_url

    def venv_cache(self) -> str:
        """Commands run from HOME on the workers and argv gets no ``~`` expansion: make ``~/x`` plain ``x``."""
        cache = self.gcp.venv_cache
        return cache[2:] if cache.startswith("~/") else cache

    def python(self) -> str:
        return self.gcp.python

    @property
    def bucket_url(self) -> str:
        return self.config.bucket or f"gs://{self.project}-tpuft"

    # -- the node spec ---------------------------------------------------------------------------------------
    def node_spec(self) -> Any:
        from google.cloud import tpu_v2

        gcp = self.gcp
        node = tpu_v2.Node(
            runtime_version=gcp.runtime_version or self.accelerator.default_runtime,
            labels={"created-by": "tpuft", **gcp.labels},
            metadata=dict(gcp.metadata),
            network_config=tpu_v2.NetworkConfig(
                network=gcp.network or "",
                subnetwork=gcp.subnetwork or "",
                enable_external_ips=not gcp.internal_ip,
            ),
            scheduling_config=tpu_v2.SchedulingConfig(preemptible=gcp.preemptible, spot=gcp.spot, reserved=gcp.reserved),
        )
        if gcp.topology:
            generation = self.accelerator.generation.name
            type_name = {"v5litepod": "V5LITE_POD", "v5p": "V5P", "v6e": "V6E"}.get(generation, generation.upper())
            node.accelerator_config = tpu_v2.AcceleratorConfig(type_=type_name, topology=gcp.topology)
        else:
            node.accelerator_type = self.accelerator.name
        if gcp.service_account:
            node.service_account = tpu_v2.ServiceAccount(email=gcp.service_account, scope=list(gcp.scopes))
        return node

    def shape_of(self, node: Any) -> str:
        if node.accelerator_type:
            return str(node.accelerator_type)
        config = node.accelerator_config
        return f"{config.type_.name if hasattr(config.type_, 'name') else config.type_}:{config.topology}"

    def wanted_shape(self) -> str:
        return self.shape_of(self.node_spec())

    # -- verbs -----------------------------------------------------------------------------------------------
    def create(self, progress: Progress | None = None) -> tuple[Cluster, bool]:
        existing = self.get()
        if existing.state != State.NOT_FOUND:
            self._check_reusable(existing)
            self._ensure_bucket(existing, progress)
            return existing, False
        if self.gcp.queued:
            self._create_queued(progress)
        else:
            self._create_node(progress)
        cluster = self.get()
        if cluster.state != State.READY:
            raise GcpError(
                f"TPU {self.config.name} ended up {cluster.state} instead of READY",
                hint="See: tpuft status; then tpuft delete --yes && tpuft create",
            )
        self._ensure_bucket(cluster, progress)
        return cluster, True

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]

    def _ensure_bucket(self, cluster: Cluster, progress: Progress | None) -> None:
        """The run storage lives in the zone's region: same-region traffic is fast and free."""
        from tpuft.storage import open_storage

        if progress:
            progress(f"bucket {self.bucket_url} in {self.region}")
        created, warning = open_storage(self.bucket_url, project=self.project).ensure_bucket(self.region)
        cluster.details["bucket"] = f"{self.bucket_url} ({'created' if created else 'exists'})"
        if warning:
            cluster.details["bucket_warning"] = warning

    def _check_reusable(self, cluster: Cluster) -> None:
        if cluster.details.get("shape") and cluster.details["shape"] != self.wanted_shape():
            raise UsageError(
                f"TPU {self.config.name} exists in {self.zone} as {cluster.details['shape']}, "
                f"the cluster file asks for {self.wanted_shape()}",
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

    def _create_node(self, progress: Progress | None) -> None:
        node_id = self.config.name
        operation = self._call(
            "creating TPU node", self.client().create_node, parent=self.parent, node_id=node_id, node=self.node_spec()
        )
        self._wait_operation(
            f"creating TPU node {node_id}", operation, progress, lambda: f"{node_id}: {self._node_state(node_id)}"
        )

    def _create_queued(self, progress: Progress | None) -> None:
        from google.cloud import tpu_v2
        from google.protobuf import duration_pb2, timestamp_pb2

        gcp = self.gcp
        QR = tpu_v2.QueuedResource
        spec = QR.Tpu.NodeSpec(parent=self.parent, node=self.node_spec())
        if gcp.slices > 1:
            spec.multislice_params = QR.Tpu.NodeSpec.MultisliceParams(node_count=gcp.slices, node_id_prefix=self.config.name)
        else:
            spec.node_id = self.config.name
        resource = QR(tpu=QR.Tpu(node_spec=[spec]))
        if gcp.spot:
            resource.spot = QR.Spot()
        else:
            resource.guaranteed = QR.Guaranteed()  # reserved capacity: node scheduling_config + reservation_name
        if gcp.reservation:
            resource.reservation_name = gcp.reservation
        if gcp.valid_until:
            seconds = parse_duration(gcp.valid_until)
            if seconds is not None:
                resource.queueing_policy = QR.QueueingPolicy(valid_until_duration=duration_pb2.Duration(seconds=seconds))
            else:
                stamp = timestamp_pb2.Timestamp()
                stamp.FromJsonString(gcp.valid_until)
                resource.queueing_policy = QR.QueueingPolicy(valid_until_time=stamp)
        operation = self._call(
            "creating queued resource",
            self.client().create_queued_resource,
            parent=self.parent,
            queued_resource_id=self.config.name,
            queued_resource=resource,
        )
        self._wait_operation(f"creating queued resource {self.config.name}", operation, None, None)
        deadline = time.monotonic() + CREATE_TIMEOUT_S * 24
        while True:
            state, problem = self._queued_state()
            if progress:
                progress(f"queued resource {self.config.name}: {state}")
            if state == "ACTIVE":
                return
            if state in QUEUED_FAILED:
                raise GcpError(
                    f"queued resource {self.config.name} is {state}: {problem or 'no reason given'}",
                    hint="Delete it (tpuft delete --yes) so it stops holding quota, then retry or change zone/shape.",
                )
            if time.monotonic() > deadline:
                raise GcpError(f"queued resource {self.config.name} still {state}", hint="See: tpuft status")
            time.sleep(POLL_SECONDS)

    def _queued_state(self) -> tuple[str, str]:
        resource = self._call(
            "reading queued resource", self.client().get_queued_resource, name=self.queued_path(), missing_ok=True
        )
        state = resource.state.state.name
        problem = ""
        if state == "FAILED":
            problem = resource.state.failed_data.error.message
        return state, problem

    def _node_state(self, node_id: str) -> str:
        from google.api_core import exceptions as gexc

        try:
            return self._call("reading TPU node", self.client().get_node, name=self.node_path(node_id), missing_ok=True).state.name
        except gexc.NotFound:
            return "REQUESTED"
        except GcpError as exc:
            return f"unknown ({getattr(exc, 'kind', 'error')})"

    def get(self) -> Cluster:
        from google.api_core import exceptions as gexc

        queued_state = ""
        queued_problem = ""
        if self.gcp.queued:
            try:
                queued_state, queued_problem = self._queued_state()
            except gexc.NotFound:
                pass
        nodes = []
        found_ids = []
        for node_id in self.node_ids():
            try:
                nodes.append(self._call("reading TPU node", self.client().get_node, name=self.node_path(node_id), missing_ok=True))
                found_ids.append(node_id)
            except gexc.NotFound:
                continue
        details: dict[str, str] = {"project": self.project, "zone": self.zone}
        if queued_state:
            details["queued_resource"] = queued_state
            if queued_problem:
                details["problem"] = queued_problem
        if not nodes:
            state = queued_state or State.NOT_FOUND
            return Cluster(self.config.name, self.name, state, self.config.accelerator, [], self.bucket_url, details)
        workers: list[Worker] = []
        states = []
        for node in nodes:
            states.append(node.state.name)
            for endpoint in node.network_endpoints:
                external = endpoint.access_config.external_ip if endpoint.access_config else ""
                address = endpoint.ip_address if self.gcp.internal_ip or not external else external
                workers.append(Worker(index=len(workers), address=address, internal_address=endpoint.ip_address))
        details["shape"] = self.shape_of(nodes[0])
        details["health"] = ", ".join(sorted({n.health.name for n in nodes if n.health}))
        symptoms = [s.details for n in nodes for s in n.symptoms]
        if symptoms:
            details["symptoms"] = "; ".join(symptoms)
        if len(nodes) < len(self.node_ids()):
            details["problem"] = f"{len(nodes)} of {len(self.node_ids())} slices exist"
        state = states[0] if len(set(states)) == 1 else ",".join(states)
        if len(nodes) < len(self.node_ids()) and state == State.READY:
            state = State.BROKEN
        cluster = Cluster(self.config.name, self.name, state, self.shape_of(nodes[0]), workers, self.bucket_url, details)
        identity = [[node_id, str(node.id), len(node.network_endpoints)] for node_id, node in zip(found_ids, nodes)]
        self._remember(cluster, identity)
        return cluster

    # -- a short-lived local memory of the cluster, so `exec` and `ssh` need no API round trip ----------------
    CACHE_SECONDS = 600.0

    @property
    def _cache_path(self) -> Path:
        return self.state_dir() / "cluster.json"

    def _remember(self, cluster: Cluster, nodes: list[list[Any]] | None = None) -> None:
        """``nodes``: [node id, the API's unique ``id``, worker count] per slice; the ``id`` changes when a node is
        recreated under the same name, which is what tells ``prepare`` that the pinned host keys are stale."""
        previous = self._read_cache() or {}
        workers = [[w.index, w.address, w.internal_address] for w in cluster.workers]
        record = {
            "time": time.time(),
            "state": cluster.state,
            "accelerator": cluster.accelerator,
            "bucket": cluster.bucket,
            "details": cluster.details,
            "workers": workers,
            "nodes": nodes or [],
            "key": previous.get("key", "") if previous.get("workers") == workers else "",  # same node, same metadata
            "pins": previous.get("pins"),  # checked against nodes and addresses before use (see _pin_host_keys)
        }
        self._write_cache(record)

    def _write_cache(self, record: dict[str, Any]) -> None:
        self._cache_path.parent.mkdir(parents=True, exist_ok=True)
        self._cache_path.write_text(json.dumps(record))

    def _read_cache(self) -> dict[str, Any] | None:
        try:
            return json.loads(self._cache_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def forget(self) -> None:
        self._cache_path.unlink(missing_ok=True)

    def cached(self) -> Cluster | None:
        """The cluster as last seen, if READY and seen in the last few minutes; None means: ask the API."""
        record = self._read_cache()
        if not record or record.get("state") != State.READY or time.time() - record.get("time", 0) > self.CACHE_SECONDS:
            return None
        workers = [Worker(index=i, address=a, internal_address=n) for i, a, n in record["workers"]]
        return Cluster(self.config.name, self.name, State.READY, record["accelerator"], workers, record["bucket"], record["details"])

    def delete(self, progress: Progress | None = None) -> bool:
        from google.api_core import exceptions as gexc

        (self.state_dir() / "known_hosts").unlink(missing_ok=True)  # the next node may reuse these addresses
        self.forget()
        from google.cloud import tpu_v2

        client = self.client()
        if self.gcp.queued:
            try:  # force: the nodes go with it, so no abandoned request keeps holding quota
                request = tpu_v2.DeleteQueuedResourceRequest(name=self.queued_path(), force=True)
                operation = self._call("deleting queued resource", client.delete_queued_resource, request=request, missing_ok=True)
            except gexc.NotFound:
                pass
            else:
                self._wait_operation(f"deleting queued resource {self.config.name}", operation, progress, lambda: "deleting")
                return True
        deleted = False
        for node_id in self.node_ids():
            try:
                operation = self._call("deleting TPU node", client.delete_node, name=self.node_path(node_id), missing_ok=True)
            except gexc.NotFound:
                continue
            self._wait_operation(f"deleting TPU node {node_id}", operation, progress, lambda n=node_id: f"{n}: {self._node_state(n)}")
            deleted = True
        return deleted

    # -- reaching the workers ------------------------------------------------------------------------------
    def ssh_settings(self) -> SshSettings:
        from tpuft.fleet.ssh import SshSettings
        from tpuft.formats import user_name_problem
        from tpuft.providers.ssh_keys import user_name

        ssh = self.config.ssh
        user = ssh.user or user_name()
        problem = user_name_problem(user)
        if problem:  # the cluster file's ssh.user is checked when loaded; this is the local login name
            raise UsageError(f"your user name {problem}", hint="Set ssh.user in the cluster file.")
        return SshSettings(
            user=user,
            key_file=ssh.key_file.expanduser(),
            port=ssh.port,
            connect_attempts=ssh.connect_attempts,
            retry_delay_s=ssh.retry_delay_s,
            known_hosts=self.known_hosts_path,
            ssh_config=ssh.ssh_config.expanduser() if ssh.ssh_config is not None else None,
            explicit=ssh.explicit(),
        )

    @property
    def known_hosts_path(self) -> Path:
        """Per cluster, not ~/.ssh/known_hosts: a recreated node may reuse an address with new keys."""
        return self.state_dir() / "known_hosts"

    def prepare(self, cluster: Cluster) -> None:
        """Make this machine able to log in: the key pair exists and (without OS Login) its public half is in the
        node's metadata, as gcloud does it; and the workers' host keys are pinned from the API. Both are remembered
        with the cluster, so each costs API calls once per node."""
        from tpuft.providers.ssh_keys import ensure_key

        settings = self.ssh_settings()
        public = ensure_key(settings.key_file, settings.user)
        entry = f"{settings.user}:{public.strip()}"
        record = self._read_cache() or {}
        if not self.config.ssh.os_login and record.get("key") != entry:
            self.ensure_key_in_metadata(settings.user, public)
            if record:
                self._write_cache({**record, "key": entry})
        self._pin_host_keys(cluster, settings.port)

    # -- host keys: pinned from the API's guest attributes ----------------------------------------------------------
    def _pin_host_keys(self, cluster: Cluster, port: int) -> None:
        """Make ``known_hosts`` hold the host keys the API publishes for exactly these workers. Free when the pins
        are for the same nodes (same ``id``) and addresses; else one GetGuestAttributes per slice replaces them."""
        hosts = [known_hosts_host(worker.address, port) for worker in cluster.workers]
        record = self._read_cache() or {}
        same_workers = record.get("workers") == [[w.index, w.address, w.internal_address] for w in cluster.workers]
        nodes = record.get("nodes") if same_workers else None
        wanted = {"nodes": nodes, "hosts": hosts}
        if nodes and record.get("pins") == wanted and self.known_hosts_path.exists():
            return
        keys = self.fetch_host_keys(cluster, nodes)
        header = f"# SSH host keys of TPU {self.config.name} ({self.project}/{self.zone}) from the TPU API's guest attributes"
        write_known_hosts(self.known_hosts_path, hosts, keys, header)
        if nodes:  # only a cluster that get() described can be recognised next time
            self._write_cache({**(self._read_cache() or record), "pins": wanted})

    def fetch_host_keys(self, cluster: Cluster, nodes: list[list[Any]] | None = None) -> list[list[str]]:
        """Every worker's host keys (``"ssh-ed25519 AAAA..."`` lines), in worker order across slices. ``nodes`` gives
        the workers per slice; without it the slices split the workers evenly (they share one shape)."""
        if nodes:
            counts = [(str(node_id), int(count)) for node_id, _, count in nodes]
        else:
            slices = len(self.node_ids())
            per_node, extra = divmod(len(cluster.workers), slices)
            if extra:
                raise GcpError(f"TPU {self.config.name}: {len(cluster.workers)} workers on {slices} slices", hint="See: tpuft status")
            counts = [(node_id, per_node) for node_id in self.node_ids()]
        if sum(count for _, count in counts) != len(cluster.workers):
            raise GcpError(f"TPU {self.config.name} changed while being read", hint="Retry, or see: tpuft status")
        keys: list[list[str]] = []
        for node_id, count in counts:
            keys.extend(self._node_host_keys(node_id, count, cluster.workers[len(keys) : len(keys) + count]))
        return keys

    def _node_host_keys(self, node_id: str, count: int, workers: list[Worker]) -> list[list[str]]:
        """One slice's keys; a VM that has just booted may not have published them yet, so ask again for the
        missing workers until ``HOSTKEY_WAIT_S`` runs out, then refuse: an unpinned host is never trusted."""
        found: dict[int, list[str]] = {}
        deadline = time.monotonic() + HOSTKEY_WAIT_S
        while True:
            missing = [i for i in range(count) if i not in found]
            found.update(self._ask_host_keys(node_id, missing))
            missing = [i for i in range(count) if i not in found]
            if not missing:
                return [found[i] for i in range(count)]
            if time.monotonic() >= deadline:
                worker = workers[missing[0]]
                others = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
                raise GcpError(
                    f"worker {worker.index} ({worker.address}) of TPU node {node_id}{others} has not published its SSH "
                    f"host keys (guest attributes) after {HOSTKEY_WAIT_S:.0f}s, so its identity cannot be checked",
                    hint="A VM that has just started publishes them within a few minutes: retry soon. If it never "
                    "does, its guest agent is not running: recreate the node (tpuft delete --yes && tpuft create).",
                )
            time.sleep(POLL_SECONDS)

    def _ask_host_keys(self, node_id: str, worker_ids: list[int]) -> dict[int, list[str]]:
        """One GetGuestAttributes for these workers of one slice: slice-local worker id -> its keys (absent: nothing
        published). The answer carries no worker ids, so it is matched by position only when it has one entry per
        worker asked; otherwise each worker is asked alone."""
        from google.cloud import tpu_v2

        request = tpu_v2.GetGuestAttributesRequest(
            name=self.node_path(node_id), query_path=f"{HOSTKEY_NAMESPACE}/", worker_ids=[str(i) for i in worker_ids]
        )
        what = f"reading the SSH host keys of TPU node {node_id}"
        entries = list(self._call(what, self.client().get_guest_attributes, request=request).guest_attributes)
        if len(entries) != len(worker_ids):
            if len(worker_ids) == 1:
                return {}
            return {i: keys for one in worker_ids for i, keys in self._ask_host_keys(node_id, [one]).items()}
        found = {i: host_key_lines(entry.query_value.items) for i, entry in zip(worker_ids, entries)}
        return {i: keys for i, keys in found.items() if keys}

    def fleet(self, cluster: Cluster) -> SshFleet:
        from tpuft.fleet.ssh import SshFleet

        return SshFleet(cluster.workers, self.ssh_settings())

    def ensure_key_in_metadata(self, user: str, public_key: str) -> bool:
        """Like gcloud: the key must be in the node's ``ssh-keys`` metadata; add it (mask: metadata) if it is not."""
        from google.protobuf import field_mask_pb2

        entry = f"{user}:{public_key.strip()}"
        changed = False
        for node_id in self.node_ids():
            node = self._call("reading TPU node", self.client().get_node, name=self.node_path(node_id))
            current = dict(node.metadata)
            lines = [line for line in current.get("ssh-keys", "").splitlines() if line.strip()]
            if entry in lines:
                continue
            current["ssh-keys"] = "\n".join([*lines, entry])
            node.metadata = current
            operation = self._call(
                "adding your SSH key to the node metadata",
                self.client().update_node,
                node=node,
                update_mask=field_mask_pb2.FieldMask(paths=["metadata"]),
            )
            self._wait_operation(f"updating metadata of {node_id}", operation, None, None)
            changed = True
        return changed


def known_hosts_host(address: str, port: int) -> str:
    """The host field of a known_hosts line as OpenSSH and paramiko look it up: ``[addr]:port`` off port 22."""
    return address if port == 22 else f"[{address}]:{port}"


def host_key_lines(items: Any) -> list[str]:
    """``"type base64"`` lines from guest-attribute entries of the ``hostkeys`` namespace (key = key type, value =
    the base64 blob, as the guest agent publishes them). Anything malformed is dropped, so a value can never add a
    line (or a host pattern) of its own to known_hosts."""
    lines = []
    for item in items:
        kind, value = str(item.key), str(item.value).strip()
        if item.namespace == HOSTKEY_NAMESPACE and _KEY_TYPE.fullmatch(kind) and _KEY_BLOB.fullmatch(value):
            lines.append(f"{kind} {value}")
    return lines


def write_known_hosts(path: Path, hosts: list[str], keys: list[list[str]], header: str) -> None:
    """Replace ``path`` at once (write then rename): a fleet never reads a half-written file, and a recreated node's
    pins never sit next to the old node's."""
    lines = [header] + [f"{host} {key}" for host, host_keys in zip(hosts, keys, strict=True) for key in host_keys]
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text("\n".join(lines) + "\n")
    os.replace(partial, path)
