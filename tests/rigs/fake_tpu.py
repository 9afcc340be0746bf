"""A local stand-in for the Cloud TPU v2 REST API that the real ``google-cloud-tpu`` client can talk to.

Nothing here reaches Google: the rig is a stdlib ``ThreadingHTTPServer`` on 127.0.0.1 that speaks the same
paths, query parameters, JSON (camelCase, proto3 JSON rules) and error shapes as ``tpu.googleapis.com/v2``, so
code under test uses the genuine ``tpu_v2.TpuClient`` REST transport, long-running operations and exception
mapping.

Connecting the real client (verified with google-cloud-tpu 1.28, google-api-core 2.44)::

    from google.auth.credentials import AnonymousCredentials
    from google.cloud import tpu_v2

    with FakeTpuServer() as server:
        client = tpu_v2.TpuClient(
            transport="rest",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": server.endpoint},  # "http://127.0.0.1:PORT"
        )

The REST transport keeps a scheme given in ``api_endpoint`` (``rest_base.py`` only prepends ``https://`` when
none is given), and the LRO polling client is built from the same host, so ``http://`` reaches this plain-HTTP
server for every call. ``AnonymousCredentials`` sends no Authorization header and needs no ADC.

Long-running operations and how long ``operation.result()`` takes
-----------------------------------------------------------------
Mutating calls answer an Operation with ``done: false``. It turns done on the ``operation_polls``-th GET of
the operation (default 2; a GET of the node it targets counts too, so callers that poll the node also make
progress). ``operation_polls = 1`` makes the first poll finish it; ``0`` returns it already done.

``Operation.result()`` calls GET first and sleeps only while the operation is not done, with google-api-core's
``DEFAULT_POLLING`` (initial 1.0 s, x1.5, max 20 s, full jitter: each sleep is ``uniform(0, delay)``). So with
the default of 2 polls one random sleep of 0..1 s happens. To make it take milliseconds, pass a faster polling
policy::

    from google.api_core.future.polling import DEFAULT_POLLING
    FAST = DEFAULT_POLLING.with_delay(initial=0.01, maximum=0.05).with_timeout(5)
    node = client.create_node(...).result(polling=FAST)        # or: op._polling = FAST; op.result()

``result(timeout=X)`` only bounds the total wait (raises ``concurrent.futures.TimeoutError``); it does not
change the sleep. ``result(retry=R)`` sets the retry of each polling GET (default: retries ServiceUnavailable
with initial 0.5 s, deadline 10 s).

What the real client does with this server's answers (google-api-core maps REST errors by HTTP status only)
----------------------------------------------------------------------------------------------------------
* 404 NOT_FOUND -> ``NotFound``; 409 ALREADY_EXISTS -> ``Conflict`` (*not* ``AlreadyExists``); 400
  INVALID_ARGUMENT and FAILED_PRECONDITION -> ``BadRequest``; 403 PERMISSION_DENIED -> ``Forbidden``
  (``exc.reason`` comes from the ErrorInfo detail); 429 RESOURCE_EXHAUSTED -> ``TooManyRequests``; 503
  UNAVAILABLE -> ``ServiceUnavailable``.
* An operation that ends with ``error`` is mapped by its gRPC code: 8 -> ``ResourceExhausted`` (a
  ``TooManyRequests``), 10 -> ``Aborted``, ... raised from ``operation.result()``.
* TPU RPCs have no default retry: one 503 reaches the caller. Polling GETs of operations do retry 503.
* Transport failures are not Google exceptions: an endpoint without ``http://`` becomes ``https://`` and fails
  at once with ``requests.exceptions.SSLError``; a server that is down gives
  ``requests.exceptions.ConnectionError``.
* The operations client parses Operation JSON strictly (``ignore_unknown_fields=False``) and needs each
  ``@type`` in the protobuf pool, so operations here carry ``google.cloud.tpu.v2.OperationMetadata`` and exact
  field names.
* Real-world shapes this rig copies: zone stockouts arrive as a *finished operation* with ``error.code`` 8
  ("There is no more capacity in the zone ..."), quota refusals as an immediate HTTP 429 on the create call
  ("Quota limit '...' has been exceeded") - see ``fail_next_create``.
* The client asks for ``$alt=json;enum-encoding=int``; this server then writes enums as numbers (as Google
  does) and as names otherwise (the operations client does not ask, so operation responses carry names).

Guest attributes: ``:getGuestAttributes`` answers each worker's SSH host keys from ``host_keys`` (address ->
public key line), the way a TPU VM's guest agent publishes them and ``gcloud compute tpus tpu-vm ssh`` reads
them.

Multislice: a queued resource with ``multisliceParams.nodeCount`` N makes nodes ``PREFIX-0..N-1``, each with
its own workers (networkEndpoints, addresses drawn slice by slice from the pool) and host keys; ``preempt`` of
one slice turns the queued resource SUSPENDING; a queued resource created again after a delete gets fresh
nodes (new ``id``, addresses from ``worker_addresses`` as it is then).

Maintenance: ``announce_maintenance`` puts an ``upcomingMaintenance`` on a node (served by ``v2alpha1``
GetNode only, as in the real protos: v2's Node has no such field), ``begin_maintenance`` opens the window
(node REPAIRING), ``POST v2alpha1/...nodes/N:simulateMaintenanceEvent`` announces one ``simulated_notice_s``
ahead on the first of its ``workerIds``; ``maintenance_listeners`` hear of each announcement per worker (the
metadata server rig follows them). ``:stop`` (StopNode) takes a READY node to STOPPED: the nearest real action
to a preemption that the API offers.

Test controls (thread-safe): ``preempt``, ``add_symptom``, ``announce_maintenance``, ``begin_maintenance``,
``clear_maintenance``, ``fail_next_create``, ``transient_errors``, ``deny``, ``refuse`` (with the refusals a
first project meets, in Google's shapes: ``service_disabled``, ``billing_disabled``, ``quota_exceeded``,
``org_policy_violation``; ``deny`` is the IAM one),
``allow``, ``refuse_next`` (e.g. :func:`not_now`), ``deletes_do_not_take``, ``fail_queued``,
``suspend_queued``, ``settle``, ``reset``; settings ``operation_polls``, ``queued_states``,
``queued_gets_per_state``, ``suspending_gets``, ``worker_addresses``, ``external_addresses``,
``default_external_ips``, ``host_keys``, ``omit_unpublished``; the log ``requests``. Wrapping it in a fixture
is one line::

    @pytest.fixture
    def fake_tpu() -> Iterator[FakeTpuServer]:
        with FakeTpuServer() as server:
            yield server
"""

from __future__ import annotations

import copy
import ipaddress
import itertools
import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # annotations only: the rig imports nothing outside the standard library at run time
    pass
from urllib.parse import parse_qsl, unquote, urlsplit

from tests.rigs.json_server import JsonApiServer

Json = dict[str, Any]

NODE_TYPE: Final = "type.googleapis.com/google.cloud.tpu.v2.Node"
QUEUED_TYPE: Final = "type.googleapis.com/google.cloud.tpu.v2.QueuedResource"
EMPTY_TYPE: Final = "type.googleapis.com/google.protobuf.Empty"
METADATA_TYPE: Final = "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
ERROR_INFO_TYPE: Final = "type.googleapis.com/google.rpc.ErrorInfo"
WORKER_PORT: Final = 8470
DEFAULT_SERVICE_ACCOUNT: Final = "123456789012-compute@developer.gserviceaccount.com"
CLOUD_PLATFORM_SCOPE: Final = "https://www.googleapis.com/auth/cloud-platform"
STOCKOUT_MESSAGE: Final = (
    'There is no more capacity in the zone "{zone}"; you can try in another zone where Cloud TPU Nodes are '
    "offered "
    "(see https://cloud.google.com/tpu/docs/regions)"
)
QUOTA_MESSAGE: Final = (
    "Quota limit 'TPUV4PodPerProjectPerZoneForTPUAPI' has been exceeded. Limit: 0 in zone {zone}."
)

# google.rpc.Code numbers and the HTTP status Google uses for each
# (https://cloud.google.com/apis/design/errors).
GRPC_CODE: Final[dict[str, int]] = {
    "OK": 0,
    "CANCELLED": 1,
    "UNKNOWN": 2,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "ABORTED": 10,
    "OUT_OF_RANGE": 11,
    "UNIMPLEMENTED": 12,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "DATA_LOSS": 15,
    "UNAUTHENTICATED": 16,
}
HTTP_STATUS: Final[dict[str, int]] = {
    "OK": 200,
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 400,
    "ABORTED": 409,
    "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DATA_LOSS": 500,
    "UNAUTHENTICATED": 401,
}

# Enum numbers of google.cloud.tpu.v2 (cloud_tpu.proto); a test checks them against the installed descriptors.
NODE_STATE: Final[dict[str, int]] = {
    "STATE_UNSPECIFIED": 0,
    "CREATING": 1,
    "READY": 2,
    "RESTARTING": 3,
    "REIMAGING": 4,
    "DELETING": 5,
    "REPAIRING": 6,
    "STOPPED": 8,
    "STOPPING": 9,
    "STARTING": 10,
    "PREEMPTED": 11,
    "TERMINATED": 12,
    "HIDING": 13,
    "HIDDEN": 14,
    "UNHIDING": 15,
    "UNKNOWN": 16,
}
NODE_HEALTH: Final[dict[str, int]] = {
    "HEALTH_UNSPECIFIED": 0,
    "HEALTHY": 1,
    "TIMEOUT": 3,
    "UNHEALTHY_TENSORFLOW": 4,
    "UNHEALTHY_MAINTENANCE": 5,
}
API_VERSION: Final[dict[str, int]] = {
    "API_VERSION_UNSPECIFIED": 0,
    "V1_ALPHA1": 1,
    "V1": 2,
    "V2_ALPHA1": 3,
    "V2": 4,
}
ACCELERATOR_CONFIG_TYPE: Final[dict[str, int]] = {
    "TYPE_UNSPECIFIED": 0,
    "V2": 2,
    "V3": 4,
    "V4": 7,
    "V5LITE_POD": 9,
    "V5P": 10,
    "V6E": 11,
}
DISK_MODE: Final[dict[str, int]] = {"DISK_MODE_UNSPECIFIED": 0, "READ_WRITE": 1, "READ_ONLY": 2}
SYMPTOM_TYPE: Final[dict[str, int]] = {
    "SYMPTOM_TYPE_UNSPECIFIED": 0,
    "LOW_MEMORY": 1,
    "OUT_OF_MEMORY": 2,
    "EXECUTE_TIMED_OUT": 3,
    "MESH_BUILD_FAIL": 4,
    "HBM_OUT_OF_MEMORY": 5,
    "PROJECT_ABUSE": 6,
}
QUEUED_STATE: Final[dict[str, int]] = {
    "STATE_UNSPECIFIED": 0,
    "CREATING": 1,
    "ACCEPTED": 2,
    "PROVISIONING": 3,
    "FAILED": 4,
    "DELETING": 5,
    "ACTIVE": 6,
    "SUSPENDING": 7,
    "SUSPENDED": 8,
    "WAITING_FOR_RESOURCES": 9,
}
STATE_INITIATOR: Final[dict[str, int]] = {"STATE_INITIATOR_UNSPECIFIED": 0, "USER": 1, "SERVICE": 2}
# QueuedResourceState's oneof state_data member for each state (WAITING_FOR_RESOURCES has none).
QUEUED_STATE_DATA: Final[dict[str, str]] = {
    "CREATING": "creatingData",
    "ACCEPTED": "acceptedData",
    "PROVISIONING": "provisioningData",
    "FAILED": "failedData",
    "DELETING": "deletingData",
    "ACTIVE": "activeData",
    "SUSPENDING": "suspendingData",
    "SUSPENDED": "suspendedData",
}

NODE_FIELDS: Final = frozenset(
    {
        "name",
        "description",
        "acceleratorType",
        "state",
        "healthDescription",
        "runtimeVersion",
        "networkConfig",
        "networkConfigs",
        "cidrBlock",
        "serviceAccount",
        "createTime",
        "schedulingConfig",
        "networkEndpoints",
        "health",
        "labels",
        "metadata",
        "tags",
        "id",
        "dataDisks",
        "apiVersion",
        "symptoms",
        "shieldedInstanceConfig",
        "acceleratorConfig",
        "queuedResource",
        "multisliceNode",
    }
)
NODE_OUTPUT_ONLY: Final = frozenset(
    {
        "name",
        "state",
        "healthDescription",
        "createTime",
        "networkEndpoints",
        "health",
        "id",
        "apiVersion",
        "symptoms",
        "queuedResource",
        "multisliceNode",
    }
)
QUEUED_FIELDS: Final = frozenset(
    {"name", "createTime", "tpu", "spot", "guaranteed", "queueingPolicy", "state", "reservationName"}
)
# UpdateNode's documented update_mask paths (camelCase, as the client sends a FieldMask in JSON).
UPDATABLE_NODE_PATHS: Final = frozenset(
    {"description", "tags", "labels", "metadata", "networkConfig.enableExternalIps"}
)

# Accelerator families: the number in "v4-16" counts TensorCores (2 per chip) for these ...
TENSORCORE_FAMILIES: Final[dict[str, str]] = {"v2": "V2", "v3": "V3", "v4": "V4", "v5p": "V5P"}
# ... and chips for these; up to 8 chips fit one host, bigger slices have 4 chips per host.
CHIP_FAMILIES: Final[dict[str, str]] = {"v5litepod": "V5LITE_POD", "v6e": "V6E"}
CHIPS_PER_HOST: Final = 4
ID_PATTERN: Final = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
COMPUTE_PROJECT: Final = re.compile(r"/compute/v1/projects/(?P<project>[^/:]+)")
"""The one Compute Engine call ``gcloud compute tpus tpu-vm ssh`` makes (its project, for OS Login in the
project metadata: none here), served when gcloud's compute endpoint is pointed at this server
(benchmarks/fanout.py)."""
ROUTE: Final = re.compile(
    r"/(?P<version>v2|v2alpha1)/projects/(?P<project>[^/:]+)/locations/(?P<zone>[^/:]+)"
    r"/(?P<collection>nodes|queuedResources|operations)(?:/(?P<id>[^/:]+))?(?::(?P<verb>[A-Za-z]+))?"
)


class ApiError(Exception):
    """An error answered in Google's JSON shape: ``{"error": {"code", "message", "status", "details"?}}``."""

    def __init__(
        self, status: str, message: str, *, http: int | None = None, details: list[Json] | None = None
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.http = http if http is not None else HTTP_STATUS.get(status, 500)
        self.details = details or []

    def body(self) -> Json:
        error: Json = {"code": self.http, "message": self.message, "status": self.status}
        if self.details:
            error["details"] = self.details
        return {"error": error}

    def rpc_status(self) -> Json:
        """The google.rpc.Status an operation carries: gRPC code number, not the HTTP status."""
        return {"code": GRPC_CODE.get(self.status, 2), "message": self.message}


PRECONDITION_FAILURE_TYPE: Final = "type.googleapis.com/google.rpc.PreconditionFailure"
QUOTA_FAILURE_TYPE: Final = "type.googleapis.com/google.rpc.QuotaFailure"
HELP_TYPE: Final = "type.googleapis.com/google.rpc.Help"
PROJECT_NUMBER: Final = "123456789012"
"""The project number the refusals below name as their consumer (Google names the number, not the id)."""


def service_disabled(service: str = "tpu.googleapis.com", title: str = "Cloud TPU API") -> ApiError:
    """Google's 403 for a call to an API the project has not enabled: the message every new project meets,
    with the ``ErrorInfo`` (reason SERVICE_DISABLED, domain googleapis.com, consumer and service in its
    metadata) and the ``Help`` link Service Infrastructure adds."""
    url = f"https://console.developers.google.com/apis/api/{service}/overview?project={PROJECT_NUMBER}"
    message = (
        f"{title} has not been used in project {PROJECT_NUMBER} before or it is disabled. Enable it by "
        f"visiting {url} then retry. If you enabled this API recently, wait a few minutes for the action to "
        "propagate to our systems and retry."
    )
    info = {
        "@type": ERROR_INFO_TYPE,
        "reason": "SERVICE_DISABLED",
        "domain": "googleapis.com",
        "metadata": {
            "consumer": f"projects/{PROJECT_NUMBER}",
            "service": service,
            "serviceTitle": title,
            "activationUrl": url,
            "containerInfo": PROJECT_NUMBER,
        },
    }
    links = {
        "@type": HELP_TYPE,
        "links": [{"description": "Google developers console API activation", "url": url}],
    }
    return ApiError("PERMISSION_DENIED", message, details=[info, links])


def billing_disabled(service: str = "tpu.googleapis.com") -> ApiError:
    """Google's 403 when the project has no billing account (ErrorInfo reason BILLING_DISABLED)."""
    url = f"https://console.developers.google.com/billing/enable?project={PROJECT_NUMBER}"
    message = (
        f"This API method requires billing to be enabled. Please enable billing on project #{PROJECT_NUMBER} "
        f"by visiting {url} then retry."
    )
    info = {
        "@type": ERROR_INFO_TYPE,
        "reason": "BILLING_DISABLED",
        "domain": "googleapis.com",
        "metadata": {"consumer": f"projects/{PROJECT_NUMBER}", "service": service},
    }
    return ApiError("PERMISSION_DENIED", message, details=[info])


def quota_exceeded(zone: str, metric: str = "tpu.googleapis.com/tpu_v4_podslice_chips") -> ApiError:
    """Google's 429 for an allocation quota that a create would pass (ErrorInfo reason
    RESOURCE_QUOTA_EXCEEDED with the quota's metric, limit and location, and a ``QuotaFailure``)."""
    message = QUOTA_MESSAGE.format(zone=zone)
    info = {
        "@type": ERROR_INFO_TYPE,
        "reason": "RESOURCE_QUOTA_EXCEEDED",
        "domain": "googleapis.com",
        "metadata": {
            "consumer": f"projects/{PROJECT_NUMBER}",
            "service": "tpu.googleapis.com",
            "quota_metric": metric,
            "quota_limit": "TPUV4PodPerProjectPerZoneForTPUAPI",
            "quota_limit_value": "0",
            "quota_location": zone,
        },
    }
    failure = {
        "@type": QUOTA_FAILURE_TYPE,
        "violations": [{"subject": f"project:{PROJECT_NUMBER}", "description": message}],
    }
    return ApiError("RESOURCE_EXHAUSTED", message, details=[info, failure])


def org_policy_violation(
    project: str, constraint: str = "constraints/compute.vmExternalIpAccess"
) -> ApiError:
    """A 400 FAILED_PRECONDITION for a request an organization policy forbids: the constraint in a
    ``PreconditionFailure`` violation (AIP-193's shape) and in the message, as Compute Engine words it."""
    message = f"Constraint {constraint} violated for project {project}."
    failure = {
        "@type": PRECONDITION_FAILURE_TYPE,
        "violations": [
            {"type": constraint, "subject": f"orgpolicy:projects/{project}", "description": message}
        ],
    }
    return ApiError("FAILED_PRECONDITION", message, details=[failure])


def not_found(name: str) -> ApiError:
    return ApiError("NOT_FOUND", f"Resource '{name}' was not found")


def invalid(message: str) -> ApiError:
    return ApiError("INVALID_ARGUMENT", message)


def not_now(name: str) -> ApiError:
    """HTTP 409 ABORTED: another operation holds the resource (one just created, or being changed)."""
    return ApiError("ABORTED", f"Resource '{name}' is busy with another operation; try again later.")


@dataclass
class _Refusal:
    """An armed ``refuse`` (``left`` None: until ``allow``) or ``refuse_next`` (``left`` answers to go)."""

    pattern: str
    error: ApiError
    left: int | None


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it; ``query`` keeps the last value of each parameter."""

    method: str
    path: str
    query: dict[str, str]
    body: Any
    status: int
    rpc: str


@dataclass(frozen=True)
class Topology:
    """What an accelerator type means for the VMs: how many hosts (workers) and the canonical names."""

    accelerator_type: str
    config_type: str
    chips: int
    hosts: int


def topology_for(accelerator_type: str) -> Topology:
    """Hosts of a slice type, e.g. v4-8 -> 1, v4-32 -> 4, v5litepod-8 -> 1, v5litepod-16 -> 4. Raises
    INVALID_ARGUMENT."""
    match = re.fullmatch(r"(?P<family>v[0-9a-z]+)-(?P<size>[0-9]+)", accelerator_type)
    family, size = (match["family"], int(match["size"])) if match else ("", 0)
    if family in TENSORCORE_FAMILIES and size >= 8 and size % 8 == 0:
        chips = size // 2
        return Topology(accelerator_type, TENSORCORE_FAMILIES[family], chips, max(1, chips // CHIPS_PER_HOST))
    if family in CHIP_FAMILIES and (size in (1, 4, 8) or (size >= 16 and size % 16 == 0)):
        hosts = 1 if size <= 8 else size // CHIPS_PER_HOST
        return Topology(accelerator_type, CHIP_FAMILIES[family], size, hosts)
    raise invalid(f"Accelerator type '{accelerator_type}' is not supported or not available in this zone.")


def topology_for_config(config: Json) -> Topology:
    """The same for an ``acceleratorConfig`` {type, topology "2x2x1"}: chips are the topology's product."""
    kind = enum_name(config.get("type", "TYPE_UNSPECIFIED"), ACCELERATOR_CONFIG_TYPE)
    dims = str(config.get("topology", ""))
    if not re.fullmatch(r"[0-9]+(x[0-9]+){1,2}", dims):
        raise invalid(f"Invalid topology '{dims}' in acceleratorConfig.")
    chips = 1
    for dim in dims.split("x"):
        chips *= int(dim)
    for families, per_chip in ((TENSORCORE_FAMILIES, 2), (CHIP_FAMILIES, 1)):
        for prefix, name in families.items():
            if name == kind:
                return topology_for(f"{prefix}-{chips * per_chip}")
    raise invalid(f"Invalid acceleratorConfig.type '{config.get('type')}'.")


def enum_name(value: Any, table: dict[str, int]) -> str:
    """Accept an enum as its name or its number (the client sends numbers); keep names internally."""
    if isinstance(value, int) and not isinstance(value, bool):
        for name, number in table.items():
            if number == value:
                return name
    if isinstance(value, str) and value in table:
        return value
    raise invalid(f"Invalid value for enum field: {value!r}")


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def rfc3339(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def camel(path: str) -> str:
    """``network_config.enable_external_ips`` -> ``networkConfig.enableExternalIps`` (FieldMask JSON form)."""
    return ".".join(re.sub(r"_([a-z])", lambda m: m[1].upper(), part) for part in path.split("."))


def _map_enums(node: Json, convert: Callable[[Any, dict[str, int]], Any]) -> Json:
    """Apply ``convert`` to every enum field of a Node JSON (in place) and return it."""
    for key, table in (("state", NODE_STATE), ("health", NODE_HEALTH), ("apiVersion", API_VERSION)):
        if key in node:
            node[key] = convert(node[key], table)
    if "type" in node.get("acceleratorConfig", {}):
        node["acceleratorConfig"]["type"] = convert(
            node["acceleratorConfig"]["type"], ACCELERATOR_CONFIG_TYPE
        )
    for disk in node.get("dataDisks", []):
        if "mode" in disk:
            disk["mode"] = convert(disk["mode"], DISK_MODE)
    for symptom in node.get("symptoms", []):
        if "symptomType" in symptom:
            symptom["symptomType"] = convert(symptom["symptomType"], SYMPTOM_TYPE)
    return node


def _to_number(value: Any, table: dict[str, int]) -> Any:
    return table.get(value, value)


def render_node(node: Json, ints: bool) -> Json:
    out = copy.deepcopy(node)
    return _map_enums(out, _to_number) if ints else out


def render_queued(queued: Json, ints: bool) -> Json:
    out = copy.deepcopy(queued)
    if ints:
        state = out.get("state", {})
        if "state" in state:
            state["state"] = QUEUED_STATE[state["state"]]
        if "stateInitiator" in state:
            state["stateInitiator"] = STATE_INITIATOR[state["stateInitiator"]]
        for spec in out.get("tpu", {}).get("nodeSpec", []):
            if "node" in spec:
                _map_enums(spec["node"], _to_number)
    return out


@dataclass
class _Operation:
    """A long-running operation; ``finish`` produces the response (or raises ApiError) when it completes."""

    name: str
    target: str
    verb: str
    response_type: str
    polls_left: int
    finish: Callable[[], Json]
    create_time: str = field(default_factory=now_rfc3339)
    end_time: str | None = None
    response: Json | None = None
    error: Json | None = None

    @property
    def done(self) -> bool:
        return self.end_time is not None

    def complete(self) -> None:
        if self.done:
            return
        try:
            self.response = self.finish()
        except ApiError as exc:
            self.error = exc.rpc_status()
        self.end_time = now_rfc3339()

    def render(self, ints: bool) -> Json:
        metadata: Json = {
            "@type": METADATA_TYPE,
            "createTime": self.create_time,
            "target": self.target,
            "verb": self.verb,
            "cancelRequested": False,
            "apiVersion": "v2",
        }
        if self.end_time:
            metadata["endTime"] = self.end_time
        out: Json = {"name": self.name, "metadata": metadata, "done": self.done}
        if self.error is not None:
            out["error"] = dict(self.error)
        elif self.response is not None:
            body = self.response
            if self.response_type == NODE_TYPE:
                body = render_node(body, ints)
            elif self.response_type == QUEUED_TYPE:
                body = render_queued(body, ints)
            out["response"] = {"@type": self.response_type, **copy.deepcopy(body)}
        return out


@dataclass
class _Queued:
    """Server-side record of a queued resource: the echoed request plus its state machine."""

    name: str
    spec: Json
    create_time: str
    node_names: list[str]
    state: str
    initiator: str = "SERVICE"
    error: Json | None = None
    views: int = 0
    fail_with: ApiError | None = None

    def render(self) -> Json:
        out: Json = {"name": self.name, "createTime": self.create_time, **copy.deepcopy(self.spec)}
        state: Json = {"state": self.state, "stateInitiator": self.initiator}
        data_key = QUEUED_STATE_DATA.get(self.state)
        if data_key:
            state[data_key] = {"error": dict(self.error)} if self.state == "FAILED" and self.error else {}
        out["state"] = state
        return out


@dataclass
class _Call:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    ints: bool


@dataclass
class _Route:
    rpc: str
    permission: str
    resource: str
    run: Callable[[], Json]


class FakeTpuServer(JsonApiServer):
    """The fake Cloud TPU v2 API. ``with FakeTpuServer() as server:`` serves on ``server.endpoint`` until
    exit."""

    def __init__(self, *, operation_polls: int = 2, queued_gets_per_state: int = 1) -> None:
        self.operation_polls = operation_polls
        """GETs of an operation (or of the node it targets) until it reports done; 0 = done at once."""
        self.queued_states: tuple[str, ...] = ("ACCEPTED", "PROVISIONING", "ACTIVE")
        """States a queued resource walks through; nodes appear (CREATING) at PROVISIONING, are READY at
        ACTIVE."""
        self.queued_gets_per_state = queued_gets_per_state
        """GETs of a queued resource that see each state before the next GET moves it on."""
        self.worker_addresses: list[str] | None = None
        """Addresses handed to workers in order (free ones first, then reused cyclically); None =
        127.0.1.(10+i)."""
        self.external_addresses: list[str] | None = None
        """externalIp per entry of ``worker_addresses`` (same index); None = externalIp equals ipAddress."""
        self.host_keys: dict[str, str] = {}
        """Worker address (ipAddress or externalIp) -> its OpenSSH public host key line(s), ``"ssh-ed25519
        AAAA..."``, published by the worker's guest agent as guest attributes (namespace ``hostkeys``, key =
        the key type, value = the base64 blob). A worker whose address is absent has published nothing yet:
        its entry has no items."""
        self.omit_unpublished = False
        """Leave workers with no published keys out of a GetGuestAttributes answer instead of giving them an
        empty entry (the real service's choice is undocumented; callers must not map answers to workers by
        position)."""
        self.default_external_ips = True
        """Whether a node created without networkConfig gets external IPs (with one, enableExternalIps
        decides)."""
        self.simulated_notice_s = 60.0
        """How far ahead of now a ``:simulateMaintenanceEvent`` puts the window it announces."""
        self.maintenance_listeners: list[Callable[[str, str, Json], None]] = []
        """Called with (node id, worker id, the UpcomingMaintenance JSON) when a maintenance is announced on
        one worker: how the metadata server rig (``metadata_server.MetadataServer.follow``) learns what to
        serve."""
        self.suspending_gets: int | None = 3
        """GETs of a SUSPENDING queued resource after which it is SUSPENDED on its own, as the service ends
        the transition (None: only ``suspend_queued`` ends it)."""
        self.requests: list[RecordedRequest] = []
        super().__init__("fake-tpu")
        self.reset()

    def reset(self) -> None:
        """Forget every resource, operation, armed failure and logged request (settings stay)."""
        with self._lock:
            self._nodes: dict[str, Json] = {}
            self._addresses: dict[str, list[str]] = {}
            self._operations: dict[str, _Operation] = {}
            self._queued: dict[str, _Queued] = {}
            self._op_counter = itertools.count(1)
            self._id_counter = itertools.count(1)
            self._planned: dict[str, list[tuple[str, Json, bool]]] = {}
            self._fail_create: list[tuple[ApiError, bool]] = []
            self._fail_queued: dict[str | None, ApiError] = {}
            self._transient: list[ApiError] = []
            self._denied: list[str] = []
            self._refused: list[_Refusal] = []
            self._deletes_not_taking = 0
            self._maintenance: dict[str, Json] = {}
            self.requests.clear()

    # ---- test controls ------------------------------------------------------------------------------------

    def preempt(self, node: str) -> None:
        """Spot/preemptible reclaim: the node goes to PREEMPTED (endpoints kept, health dropped).

        A single node's queued resource, if any, is left alone (call ``suspend_queued`` as well to play that
        side). One slice of a multislice queued resource takes the whole request with it: the queued resource
        turns SUSPENDING (initiator SERVICE; the proto: "the resources specified in the QueuedResource request
        are being deleted ... initiated by the user, or the Cloud TPU service") while the other slices' nodes
        still show READY; ``suspend_queued`` then ends it SUSPENDED with every node gone. The real service's
        exact sequence for a multislice spot request is not documented; this is the rig's reading
        (docs/multislice.md)."""
        with self._lock:
            name = self._node_name(node)
            record = self._nodes[name]
            record["state"] = "PREEMPTED"
            record.pop("health", None)
            queued = self._queued.get(str(record.get("queuedResource", "")))
            if queued is not None and record.get("multisliceNode") and queued.state == "ACTIVE":
                self._set_queued_state(queued, "SUSPENDING", "SERVICE")

    def add_symptom(
        self, node: str, symptom_type: str = "HBM_OUT_OF_MEMORY", details: str = "", worker_id: str = "0"
    ) -> None:
        """Attach a Symptom, as the service does for unhealthy workers."""
        enum_name(symptom_type, SYMPTOM_TYPE)
        with self._lock:
            record = self._nodes[self._node_name(node)]
            symptom = {
                "createTime": now_rfc3339(),
                "symptomType": symptom_type,
                "details": details,
                "workerId": worker_id,
            }
            record.setdefault("symptoms", []).append(symptom)

    def announce_maintenance(
        self,
        node: str,
        *,
        starts_in: float = 600.0,
        lasts: float = 3600.0,
        kind: str = "SCHEDULED",
        worker_id: str = "0",
    ) -> Json:
        """Upcoming maintenance on a node, as ``v2alpha1`` GetNode shows it (``upcomingMaintenance``: type,
        window start and end, latest start, status PENDING); the v2 API has no such field, so v2 answers leave
        it out. The listeners hear of it for ``worker_id`` (the worker whose metadata key would announce
        it)."""
        if kind not in ("SCHEDULED", "UNSCHEDULED"):
            raise ValueError(f"maintenance type {kind!r}: SCHEDULED or UNSCHEDULED")
        start = time.time() + starts_in
        window = {
            "type": kind,
            "canReschedule": kind == "SCHEDULED",
            "windowStartTime": rfc3339(start),
            "windowEndTime": rfc3339(start + lasts),
            "latestWindowStartTime": rfc3339(start),
            "maintenanceStatus": "PENDING",
        }
        with self._lock:
            name = self._node_name(node)
            if name not in self._nodes:
                raise KeyError(node)
            self._maintenance[name] = window
            listeners = list(self.maintenance_listeners)
        for listener in listeners:
            listener(name.rsplit("/", 1)[-1], worker_id, copy.deepcopy(window))
        return copy.deepcopy(window)

    def begin_maintenance(self, node: str) -> None:
        """The window opens: the status turns ONGOING and the node REPAIRING (health UNHEALTHY_MAINTENANCE),
        which is how a TPU VM that cannot live-migrate goes away for maintenance; the watcher sees a node not
        READY."""
        with self._lock:
            name = self._node_name(node)
            self._maintenance.setdefault(name, {"type": "UNSCHEDULED"})["maintenanceStatus"] = "ONGOING"
            self._nodes[name]["state"] = "REPAIRING"
            self._nodes[name]["health"] = "UNHEALTHY_MAINTENANCE"

    def clear_maintenance(self, node: str) -> None:
        with self._lock:
            self._maintenance.pop(self._node_name(node), None)

    def fail_next_create(
        self,
        status: str = "RESOURCE_EXHAUSTED",
        message: str | None = None,
        *,
        code: int | None = None,
        synchronous: bool = False,
    ) -> None:
        """Make the next CreateNode fail.

        By default the way a stockout looks on the real API: the create call succeeds, and its operation ends
        with ``error: {code: 8, message: "There is no more capacity in the zone ..."}``
        (``operation.result()`` raises ``ResourceExhausted``). ``synchronous=True`` is how quota errors look:
        the POST itself answers HTTP ``code`` (default for the status, 429 for RESOURCE_EXHAUSTED) with
        ``Quota limit ... has been exceeded``.
        """
        if status not in GRPC_CODE:
            raise ValueError(f"unknown google.rpc.Code name {status!r}")
        default = QUOTA_MESSAGE if synchronous else STOCKOUT_MESSAGE
        error = ApiError(status, message or default, http=code)
        with self._lock:
            self._fail_create.append((error, synchronous))

    def transient_errors(self, count: int, status: str = "UNAVAILABLE", message: str | None = None) -> None:
        """The next ``count`` requests of any kind answer this error (503 UNAVAILABLE by default)."""
        error = ApiError(status, message or "The service is currently unavailable.")
        with self._lock:
            self._transient.extend([error] * count)

    def deny(self, pattern: str) -> None:
        """Answer 403 PERMISSION_DENIED to requests whose IAM permission (``tpu.nodes.create``), RPC name
        (``CreateNode``) or ``"METHOD /path"`` contains ``pattern``."""
        with self._lock:
            self._denied.append(pattern)

    def refuse(self, pattern: str, error: ApiError) -> None:
        """Answer ``error`` (e.g. :func:`service_disabled`, :func:`billing_disabled`, :func:`quota_exceeded`,
        :func:`org_policy_violation`) to every request that ``deny(pattern)`` would match, until ``allow``."""
        with self._lock:
            self._refused.append(_Refusal(pattern, error, None))

    def refuse_next(self, pattern: str, error: ApiError, count: int = 1) -> None:
        """Answer ``error`` to the next ``count`` requests that ``deny(pattern)`` would match (e.g. a 409 to a
        delete of a resource just created: :func:`not_now`)."""
        with self._lock:
            self._refused.append(_Refusal(pattern, error, count))

    def deletes_do_not_take(self, count: int = 1) -> None:
        """The next ``count`` DeleteQueuedResource / DeleteNode calls are answered and their operations end
        done, but the resource stays as it was: what a caller sees of a delete that did not take (its
        read-back finds the resource still there)."""
        with self._lock:
            self._deletes_not_taking += count

    def allow(self, pattern: str | None = None) -> None:
        """Undo ``deny(pattern)`` and ``refuse(pattern, ...)``; with no argument undo all of them."""
        with self._lock:
            self._denied = [] if pattern is None else [p for p in self._denied if p != pattern]
            self._refused = [] if pattern is None else [r for r in self._refused if r.pattern != pattern]

    def fail_queued(
        self, queued_id: str | None = None, message: str | None = None, *, status: str = "RESOURCE_EXHAUSTED"
    ) -> None:
        """Make a queued resource FAILED with ``failedData.error`` = {code, message}.

        An existing one fails now (its nodes are removed); a name not created yet, or None for "the next one
        created", fails when it would leave ACCEPTED.
        """
        with self._lock:
            zone = "the zone"
            queued = self._find_queued(queued_id) if queued_id else None
            if queued is not None:
                zone = queued.name.split("/")[3]
            error = ApiError(status, message or STOCKOUT_MESSAGE.format(zone=zone))
            if queued is None:
                self._fail_queued[queued_id.rsplit("/", 1)[-1] if queued_id else None] = error
            else:
                self._fail_queued_now(queued, error)

    def suspend_queued(self, queued_id: str) -> None:
        """The service suspends a queued resource (e.g. its spot slice was reclaimed): SUSPENDED, nodes
        deleted."""
        with self._lock:
            queued = self._find_queued(queued_id)
            if queued is None:
                raise KeyError(queued_id)
            self._set_queued_state(queued, "SUSPENDED", "SERVICE")
            self._drop_nodes(queued.node_names)

    def settle(self) -> None:
        """Finish every pending operation and move every queued resource to its final state now."""
        with self._lock:
            for op in list(self._operations.values()):
                op.complete()
            for queued in list(self._queued.values()):
                while queued.state in self.queued_states[:-1]:
                    self._advance_queued(queued)

    def backdate(self, resource: str, seconds: float) -> None:
        """Make a node or queued resource (full name or bare id) look created ``seconds`` ago: its createTime
        is the only age the API gives, and what ``tpuft gc`` judges leftovers by."""
        with self._lock:
            stamp = rfc3339(time.time() - seconds)
            queued = self._find_queued(resource)
            if queued is not None:
                queued.create_time = stamp
            else:
                self._nodes[self._node_name(resource)]["createTime"] = stamp

    # ---- inspection ---------------------------------------------------------------------------------------

    def node(self, node: str) -> Json | None:
        """A copy of a node's JSON (enum names), by full name or bare id; None when absent."""
        with self._lock:
            try:
                return copy.deepcopy(self._nodes[self._node_name(node)])
            except KeyError:
                return None

    def queued_resource(self, queued_id: str) -> Json | None:
        with self._lock:
            queued = self._find_queued(queued_id)
            return None if queued is None else queued.render()

    def calls(self, rpc: str) -> list[RecordedRequest]:
        """Logged requests of one RPC, e.g. ``calls("UpdateNode")``."""
        with self._lock:
            return [r for r in self.requests if r.rpc == rpc]

    # ---- HTTP entry ---------------------------------------------------------------------------------------

    def handle(self, method: str, raw_path: str, raw_body: bytes) -> tuple[int, Json]:
        """Answer one request: (HTTP status, JSON body). Runs under the lock, so state changes are atomic."""
        parts = urlsplit(raw_path)
        path = unquote(parts.path)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        ints = "enum-encoding=int" in query.get("$alt", "")
        call = _Call(method, path, query, None, ints)
        with self._lock:
            route: _Route | None = None
            try:
                route = self._route(call)  # pure: the handlers run below
                unrouted = None
            except ApiError as exc:
                unrouted = exc
            try:
                if self._transient:
                    raise self._transient.pop(0)
                call.body = self._parse_body(raw_body)
                if route is None:
                    raise unrouted or ApiError("NOT_FOUND", f"{method} {path} was not found.")
                self._check_allowed(route, method, path)
                status, payload = 200, route.run()
            except ApiError as exc:
                status, payload = exc.http, exc.body()
            rpc = route.rpc if route else "Unknown"
            self.requests.append(RecordedRequest(method, path, query, call.body, status, rpc))
            return status, payload

    @staticmethod
    def _parse_body(raw: bytes) -> Any:
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise invalid(f"Invalid JSON payload received. {exc}") from None

    def _check_allowed(self, route: _Route, method: str, path: str) -> None:
        def matches(pattern: str) -> bool:
            return pattern in route.permission or pattern in route.rpc or pattern in f"{method} {path}"

        for refusal in self._refused:
            if refusal.left != 0 and matches(refusal.pattern):
                if refusal.left is not None:
                    refusal.left -= 1
                raise refusal.error
        for pattern in self._denied:
            if matches(pattern):
                info = {
                    "@type": ERROR_INFO_TYPE,
                    "reason": "IAM_PERMISSION_DENIED",
                    "domain": "tpu.googleapis.com",
                    "metadata": {"permission": route.permission, "resource": route.resource},
                }
                message = f"Permission '{route.permission}' denied on '{route.resource}'"
                raise ApiError("PERMISSION_DENIED", message, details=[info])

    def _route(self, call: _Call) -> _Route:
        project = COMPUTE_PROJECT.fullmatch(call.path)
        if project is not None and call.method == "GET":
            return _Route(
                "compute.projects.get",
                "compute.projects.get",
                f"projects/{project['project']}",
                lambda: {
                    "kind": "compute#project",
                    "name": project["project"],
                    "commonInstanceMetadata": {"kind": "compute#metadata", "items": []},
                },
            )
        match = ROUTE.fullmatch(call.path)
        if match is None:
            raise ApiError("NOT_FOUND", f"The requested URL {call.path} was not found on this server.")
        parent = f"projects/{match['project']}/locations/{match['zone']}"
        collection, item, verb = match["collection"], match["id"], match["verb"]
        name = f"{parent}/{collection}/{item}" if item else parent
        alpha = match["version"] == "v2alpha1"
        if verb:
            verbs: dict[str, tuple[str, str, Callable[[], Json]]] = {
                "getGuestAttributes": (
                    "GetGuestAttributes",
                    "tpu.nodes.get",
                    lambda: self._get_guest_attributes(name, call),
                ),
                "stop": ("StopNode", "tpu.nodes.stop", lambda: self._stop_node(name, call)),
            }
            if alpha:  # the v2alpha1 API's alone
                verbs["simulateMaintenanceEvent"] = (
                    "SimulateMaintenanceEvent",
                    "tpu.nodes.simulateMaintenanceEvent",
                    lambda: self._simulate_maintenance(name, call),
                )
            if collection != "nodes" or call.method != "POST" or item is None or verb not in verbs:
                raise ApiError("UNIMPLEMENTED", f"fake_tpu does not implement :{verb} on {collection}")
            rpc, permission, run = verbs[verb]
            return _Route(rpc, permission, name, run)
        if alpha:  # only what tpuft reads from v2alpha1: one node with its upcoming maintenance
            if (collection, call.method, item is not None) != ("nodes", "GET", True):
                raise ApiError(
                    "UNIMPLEMENTED",
                    f"fake_tpu serves only GetNode on v2alpha1, not {call.method} {call.path}",
                )
            return _Route("v2alpha1.GetNode", "tpu.nodes.get", name, lambda: self._get_node_alpha(name, call))
        table: dict[tuple[str, str, bool], tuple[str, str, Callable[[], Json]]] = {
            ("nodes", "GET", False): ("ListNodes", "tpu.nodes.list", lambda: self._list_nodes(parent, call)),
            ("nodes", "POST", False): (
                "CreateNode",
                "tpu.nodes.create",
                lambda: self._create_node(parent, call),
            ),
            ("nodes", "GET", True): ("GetNode", "tpu.nodes.get", lambda: self._get_node(name, call)),
            ("nodes", "DELETE", True): (
                "DeleteNode",
                "tpu.nodes.delete",
                lambda: self._delete_node(name, call),
            ),
            ("nodes", "PATCH", True): (
                "UpdateNode",
                "tpu.nodes.update",
                lambda: self._update_node(name, call),
            ),
            ("operations", "GET", False): (
                "ListOperations",
                "tpu.operations.list",
                lambda: self._list_operations(parent, call),
            ),
            ("operations", "GET", True): (
                "GetOperation",
                "tpu.operations.get",
                lambda: self._get_operation(name, call),
            ),
            ("queuedResources", "GET", False): (
                "ListQueuedResources",
                "tpu.queuedResources.list",
                lambda: self._list_queued(parent, call),
            ),
            ("queuedResources", "POST", False): (
                "CreateQueuedResource",
                "tpu.queuedResources.create",
                lambda: self._create_queued(parent, call),
            ),
            ("queuedResources", "GET", True): (
                "GetQueuedResource",
                "tpu.queuedResources.get",
                lambda: self._get_queued(name, call),
            ),
            ("queuedResources", "DELETE", True): (
                "DeleteQueuedResource",
                "tpu.queuedResources.delete",
                lambda: self._delete_queued(name, call),
            ),
        }
        entry = table.get((collection, call.method, item is not None))
        if entry is None:
            raise ApiError("NOT_FOUND", f"Method {call.method} {call.path} was not found.")
        rpc, permission, run = entry
        resource = name
        new_id = call.query.get(
            {"nodes": "nodeId", "queuedResources": "queuedResourceId"}.get(collection, "")
        )
        if call.method == "POST" and new_id:
            resource = f"{parent}/{collection}/{new_id}"  # what IAM names in a denied create
        return _Route(rpc, permission, resource, run)

    # ---- nodes --------------------------------------------------------------------------------------------

    def _list_nodes(self, parent: str, call: _Call) -> Json:
        nodes = [
            render_node(n, call.ints)
            for name, n in self._nodes.items()
            if name.startswith(f"{parent}/nodes/")
        ]
        return self._page(nodes, "nodes", call.query)

    def _get_guest_attributes(self, name: str, call: _Call) -> Json:
        """GetGuestAttributes: one ``{queryPath, queryValue: {items}}`` per asked worker (all when
        ``workerIds`` is empty), in the order asked; items are the ``hostkeys`` namespace built from
        ``host_keys``."""
        node = self._nodes.get(name)
        if node is None:
            raise not_found(name)
        body = call.body if call.body is not None else {}
        if not isinstance(body, dict):
            raise invalid(
                "Invalid JSON payload received. Expected an object for 'GetGuestAttributesRequest'."
            )
        known = {
            "queryPath": "queryPath",
            "query_path": "queryPath",  # proto3 JSON takes either spelling
            "workerIds": "workerIds",
            "worker_ids": "workerIds",
        }
        unknown = sorted(set(body) - set(known))
        if unknown:
            raise invalid(f'Invalid JSON payload received. Unknown name "{unknown[0]}": Cannot find field.')
        fields = {known[k]: v for k, v in body.items()}
        query_path = fields.get("queryPath", "")
        worker_ids = fields.get("workerIds", [])
        if not isinstance(query_path, str) or not isinstance(worker_ids, list):
            raise invalid(
                "Invalid JSON payload received: queryPath is a string and workerIds a list of strings."
            )
        endpoints = node.get("networkEndpoints", [])
        if not endpoints:
            raise ApiError(
                "FAILED_PRECONDITION", f"Node '{name}' is {node['state']}; it has no workers to query yet."
            )
        chosen: list[int] = []
        # gcloud's --worker=all asks for [""]: all workers, as an empty list does
        for worker_id in [w for w in worker_ids if w != ""] or [str(i) for i in range(len(endpoints))]:
            if not isinstance(worker_id, str) or not worker_id.isdigit() or int(worker_id) >= len(endpoints):
                raise invalid(
                    f"Invalid worker id {worker_id!r}: node '{name}' has workers 0..{len(endpoints) - 1}."
                )
            chosen.append(int(worker_id))
        namespace, _, key = query_path.strip("/").partition("/")
        entries = []
        for index in chosen:
            endpoint = endpoints[index]
            published = self.host_keys.get(endpoint["ipAddress"])
            if published is None:
                published = self.host_keys.get(endpoint.get("accessConfig", {}).get("externalIp", ""))
            items = [
                {"namespace": "hostkeys", "key": parts[0], "value": parts[1]}
                for parts in (line.split() for line in (published or "").splitlines())
                if len(parts) >= 2 and namespace in ("", "hostkeys") and key in ("", parts[0])
            ]
            if not items and self.omit_unpublished:
                continue
            entries.append({"queryPath": query_path, "queryValue": {"items": items} if items else {}})
        return {"guestAttributes": entries} if entries else {}

    def _get_node(self, name: str, call: _Call) -> Json:
        if name not in self._nodes:
            raise not_found(name)
        self._observe_target(name)
        if name not in self._nodes:  # a delete just finished
            raise not_found(name)
        return render_node(self._nodes[name], call.ints)

    def _get_node_alpha(self, name: str, call: _Call) -> Json:
        """GetNode of v2alpha1: the node as v2 has it plus ``upcomingMaintenance`` when one is announced. Not
        a poll of the node's operations (only v2 GETs are: tpuft's v2 calls are what the rig's polling counts
        model)."""
        if name not in self._nodes:
            raise not_found(name)
        node = render_node(self._nodes[name], call.ints)
        if name in self._maintenance:
            node["upcomingMaintenance"] = copy.deepcopy(self._maintenance[name])
        return node

    def _simulate_maintenance(self, name: str, call: _Call) -> Json:
        """SimulateMaintenanceEvent (v2alpha1): the first of ``workerIds`` (worker 0 when empty, as the proto
        says) gets a maintenance notice ``simulated_notice_s`` ahead; an operation, done after the usual
        polls."""
        node = self._nodes.get(name)
        if node is None:
            raise not_found(name)
        body = call.body if call.body is not None else {}
        if not isinstance(body, dict) or set(body) - {"workerIds", "worker_ids"}:
            raise invalid(
                "Invalid JSON payload received: SimulateMaintenanceEventRequest takes workerIds only."
            )
        worker_ids = body.get("workerIds", body.get("worker_ids", [])) or ["0"]
        workers = len(node.get("networkEndpoints", []))
        if node["state"] != "READY" or not workers:
            raise ApiError(
                "FAILED_PRECONDITION",
                f"Node '{name}' is {node['state']}; maintenance can be simulated on a READY node.",
            )
        first = worker_ids[0]
        if not isinstance(first, str) or not first.isdigit() or int(first) >= workers:
            raise invalid(f"Invalid worker id {first!r}: node '{name}' has workers 0..{workers - 1}.")
        start = time.time() + self.simulated_notice_s
        window = {
            "type": "UNSCHEDULED",
            "canReschedule": False,
            "windowStartTime": rfc3339(start),
            "windowEndTime": rfc3339(start + 600.0),
            "latestWindowStartTime": rfc3339(start),
            "maintenanceStatus": "PENDING",
        }
        self._maintenance[name] = window
        for listener in list(self.maintenance_listeners):
            listener(name.rsplit("/", 1)[-1], first, copy.deepcopy(window))
        return self._start_operation(
            self._parent_of(name),
            name,
            "simulateMaintenanceEvent",
            NODE_TYPE,
            lambda: copy.deepcopy(self._nodes.get(name) or {}),
            call.ints,
        )

    def _stop_node(self, name: str, call: _Call) -> Json:
        """StopNode: READY -> STOPPING, STOPPED when its operation is done (health dropped, workers kept)."""
        node = self._nodes.get(name)
        if node is None:
            raise not_found(name)
        if node["state"] != "READY":
            raise ApiError(
                "FAILED_PRECONDITION", f"Node '{name}' is {node['state']}; only a READY node can be stopped."
            )
        node["state"] = "STOPPING"
        node.pop("health", None)

        def finish() -> Json:
            current = self._nodes.get(name)
            if current is None:
                raise not_found(name)
            current["state"] = "STOPPED"
            return current

        return self._start_operation(self._parent_of(name), name, "stop", NODE_TYPE, finish, call.ints)

    def _create_node(self, parent: str, call: _Call) -> Json:
        node_id = call.query.get("nodeId", "")
        if not node_id:
            raise invalid("nodeId is required.")
        self._check_id(node_id, "nodeId")
        name = f"{parent}/nodes/{node_id}"
        if name in self._nodes:
            raise ApiError("ALREADY_EXISTS", f"Resource '{name}' already exists")
        node = self._new_node(name, self._node_body(call.body))
        failure: ApiError | None = None
        if self._fail_create:
            failure, synchronous = self._fail_create.pop(0)
            failure.message = failure.message.replace("{zone}", parent.split("/")[3])
            if synchronous:
                raise failure
        self._nodes[name] = node

        def finish() -> Json:
            if failure is not None:
                self._drop_nodes([name])
                raise failure
            current = self._nodes.get(name)
            if current is None or current["state"] != "CREATING":
                raise ApiError("ABORTED", f"Node '{name}' was deleted before it became ready.")
            self._make_ready(name)
            return self._nodes[name]

        return self._start_operation(parent, name, "create", NODE_TYPE, finish, call.ints)

    def _delete_node(self, name: str, call: _Call) -> Json:
        node = self._nodes.get(name)
        if node is None:
            raise not_found(name)
        if node["state"] == "DELETING":
            raise ApiError("FAILED_PRECONDITION", f"Node '{name}' is already being deleted.")
        untaken = self._untaken_delete(name, call)
        if untaken is not None:
            return untaken
        node["state"] = "DELETING"
        node.pop("health", None)

        def finish() -> Json:
            self._drop_nodes([name])
            self._after_node_gone(name)
            return {}

        return self._start_operation(self._parent_of(name), name, "delete", EMPTY_TYPE, finish, call.ints)

    def _update_node(self, name: str, call: _Call) -> Json:
        node = self._nodes.get(name)
        if node is None:
            raise not_found(name)
        mask = [camel(p.strip()) for p in call.query.get("updateMask", "").split(",") if p.strip()]
        if not mask:
            raise invalid("updateMask is required.")
        unsupported = [p for p in mask if p not in UPDATABLE_NODE_PATHS]
        if unsupported:
            raise invalid(
                f"Unsupported update_mask paths {unsupported}; supported: {sorted(UPDATABLE_NODE_PATHS)}"
            )
        if node["state"] != "READY":
            raise ApiError(
                "FAILED_PRECONDITION", f"Node '{name}' is {node['state']}; it can be updated when READY."
            )
        patch = self._node_body(call.body)

        def finish() -> Json:
            current = self._nodes.get(name)
            if current is None:
                raise not_found(name)
            for path in mask:
                if path == "networkConfig.enableExternalIps":
                    network = current.setdefault("networkConfig", {})
                    network["enableExternalIps"] = bool(
                        patch.get("networkConfig", {}).get("enableExternalIps")
                    )
                    self._set_endpoints(name)
                elif path in patch:
                    current[path] = copy.deepcopy(patch[path])
                else:
                    current.pop(path, None)
            return current

        return self._start_operation(self._parent_of(name), name, "update", NODE_TYPE, finish, call.ints)

    def _node_body(self, body: Any) -> Json:
        """A request Node: known fields only (Google rejects unknown names), enums as names, output fields
        dropped."""
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise invalid("Invalid JSON payload received. Expected an object for 'node'.")
        node = {camel(k): v for k, v in body.items()}
        unknown = sorted(set(node) - NODE_FIELDS)
        if unknown:
            raise invalid(
                f"Invalid JSON payload received. Unknown name \"{unknown[0]}\" at 'node': Cannot find field."
            )
        node = copy.deepcopy({k: v for k, v in node.items() if k not in NODE_OUTPUT_ONLY})
        return _map_enums(node, enum_name)

    def _new_node(
        self, name: str, spec: Json, *, queued: str | None = None, multislice: bool = False
    ) -> Json:
        """Validate a request Node and build the stored one in state CREATING (no endpoints until READY)."""
        if not spec.get("runtimeVersion"):
            raise invalid("runtimeVersion is required.")
        if spec.get("acceleratorType"):
            topology = topology_for(str(spec["acceleratorType"]))
        elif spec.get("acceleratorConfig"):
            topology = topology_for_config(spec["acceleratorConfig"])
        else:
            raise invalid("One of acceleratorType or acceleratorConfig must be set.")
        project, zone = name.split("/")[1], name.split("/")[3]
        region = zone.rsplit("-", 1)[0]
        network = copy.deepcopy(spec.get("networkConfig"))
        if network is None:
            network = {
                "network": f"projects/{project}/global/networks/default",
                "subnetwork": f"projects/{project}/regions/{region}/subnetworks/default",
                "enableExternalIps": self.default_external_ips,
            }
        node: Json = {
            **copy.deepcopy(spec),
            "name": name,
            "acceleratorType": topology.accelerator_type,
            "state": "CREATING",
            "networkConfig": network,
            "serviceAccount": spec.get("serviceAccount")
            or {"email": DEFAULT_SERVICE_ACCOUNT, "scope": [CLOUD_PLATFORM_SCOPE]},
            "createTime": now_rfc3339(),
            "id": str(7_000_000_000_000_000_000 + next(self._id_counter)),
            "apiVersion": "V2",
        }
        if queued:
            node["queuedResource"] = queued
        if multislice:
            node["multisliceNode"] = True
        return node

    def _make_ready(self, name: str) -> None:
        node = self._nodes[name]
        node["state"] = "READY"
        node["health"] = "HEALTHY"
        self._set_endpoints(name)

    def _set_endpoints(self, name: str) -> None:
        """Workers' networkEndpoints from the address pool; accessConfig only when external IPs are
        enabled."""
        node = self._nodes[name]
        if name not in self._addresses:
            hosts = topology_for(node["acceleratorType"]).hosts
            self._addresses[name] = self._allocate(hosts)
        external = bool(node.get("networkConfig", {}).get("enableExternalIps"))
        endpoints = []
        for address in self._addresses[name]:
            endpoint: Json = {"ipAddress": address, "port": WORKER_PORT}
            if external:
                endpoint["accessConfig"] = {"externalIp": self._external_for(address)}
            endpoints.append(endpoint)
        node["networkEndpoints"] = endpoints

    def _allocate(self, count: int) -> list[str]:
        in_use = {a for addresses in self._addresses.values() for a in addresses}
        if self.worker_addresses is None:
            base = ipaddress.IPv4Address("127.0.1.10")
            generated = (str(base + i) for i in itertools.count())
            return list(itertools.islice((a for a in generated if a not in in_use), count))
        pool = list(self.worker_addresses)
        if not pool:
            raise ApiError("INTERNAL", "fake_tpu: worker_addresses is empty")
        chosen = [a for a in pool if a not in in_use][:count]
        chosen += list(itertools.islice(itertools.cycle(pool), count - len(chosen)))
        return chosen

    def _external_for(self, address: str) -> str:
        if self.external_addresses and self.worker_addresses and address in self.worker_addresses:
            index = self.worker_addresses.index(address)
            if index < len(self.external_addresses):
                return self.external_addresses[index]
        return address

    def _drop_nodes(self, names: Iterable[str]) -> None:
        for name in names:
            self._nodes.pop(name, None)
            self._addresses.pop(name, None)

    def _after_node_gone(self, name: str) -> None:
        """A queued resource whose nodes were all deleted by hand becomes SUSPENDED (the rig's reading of the
        API's "all resources deleted" SUSPENDED state; not checked against the real service)."""
        for queued in self._queued.values():
            all_gone = not any(n in self._nodes for n in queued.node_names)
            if name in queued.node_names and queued.state == "ACTIVE" and all_gone:
                self._set_queued_state(queued, "SUSPENDED", "USER")

    def _node_name(self, node: str) -> str:
        if node.startswith("projects/"):
            return node
        matches = [name for name in self._nodes if name.rsplit("/", 1)[1] == node]
        if len(matches) != 1:
            raise KeyError(f"{node!r} matches {len(matches)} nodes; use the full name")
        return matches[0]

    # ---- operations ---------------------------------------------------------------------------------------

    def _start_operation(
        self, parent: str, target: str, verb: str, response_type: str, finish: Callable[[], Json], ints: bool
    ) -> Json:
        name = f"{parent}/operations/operation-{next(self._op_counter)}"
        op = _Operation(name, target, verb, response_type, self.operation_polls, finish)
        self._operations[name] = op
        if op.polls_left <= 0:
            op.complete()
        return op.render(ints)

    def _poll(self, op: _Operation) -> None:
        if not op.done:
            op.polls_left -= 1
            if op.polls_left <= 0:
                op.complete()

    def _observe_target(self, target: str) -> None:
        for op in list(self._operations.values()):
            if op.target == target:
                self._poll(op)

    def _get_operation(self, name: str, call: _Call) -> Json:
        op = self._operations.get(name)
        if op is None:
            raise not_found(name)
        self._poll(op)
        return op.render(call.ints)

    def _list_operations(self, parent: str, call: _Call) -> Json:
        ops = [op.render(call.ints) for name, op in self._operations.items() if name.startswith(f"{parent}/")]
        return self._page(ops, "operations", call.query)

    # ---- queued resources ---------------------------------------------------------------------------------

    def _list_queued(self, parent: str, call: _Call) -> Json:
        prefix = f"{parent}/queuedResources/"
        items = [
            render_queued(q.render(), call.ints)
            for name, q in self._queued.items()
            if name.startswith(prefix)
        ]
        return self._page(items, "queuedResources", call.query)

    def _get_queued(self, name: str, call: _Call) -> Json:
        queued = self._queued.get(name)
        if queued is None:
            raise not_found(name)
        if queued.views >= self.queued_gets_per_state:  # earlier GETs have seen this state enough
            self._advance_queued(queued)
        if queued.state == "SUSPENDING" and self.suspending_gets is not None:
            if queued.views >= self.suspending_gets:
                self._set_queued_state(queued, "SUSPENDED", "SERVICE")
                self._drop_nodes(queued.node_names)
        queued.views += 1
        return render_queued(queued.render(), call.ints)

    def _create_queued(self, parent: str, call: _Call) -> Json:
        queued_id = call.query.get("queuedResourceId", "")
        if not queued_id:
            raise invalid("queuedResourceId is required.")
        self._check_id(queued_id, "queuedResourceId")
        name = f"{parent}/queuedResources/{queued_id}"
        if name in self._queued:
            raise ApiError("ALREADY_EXISTS", f"Resource '{name}' already exists")
        spec, planned = self._queued_body(name, parent, call.body)
        for node_name, _, _ in planned:
            if node_name in self._nodes or any(node_name in q.node_names for q in self._queued.values()):
                raise ApiError("ALREADY_EXISTS", f"Resource '{node_name}' already exists")
        queued = _Queued(name, spec, now_rfc3339(), [n for n, _, _ in planned], self.queued_states[0])
        queued.fail_with = self._fail_queued.pop(queued_id, None) or self._fail_queued.pop(None, None)
        self._queued[name] = queued
        self._planned[name] = planned
        self._enter_state(queued, queued.state)  # a custom queued_states may start at PROVISIONING or ACTIVE
        return self._start_operation(parent, name, "create", QUEUED_TYPE, queued.render, call.ints)

    def _queued_body(self, name: str, parent: str, body: Any) -> tuple[Json, list[tuple[str, Json, bool]]]:
        """Validate a QueuedResource; return the echo-able spec and the nodes it will make (name, Node,
        multislice)."""
        if not isinstance(body, dict):
            raise invalid("Invalid JSON payload received. Expected an object for 'queued_resource'.")
        spec = {camel(k): copy.deepcopy(v) for k, v in body.items()}
        unknown = sorted(set(spec) - QUEUED_FIELDS)
        if unknown:
            raise invalid(
                f"Invalid JSON payload received. Unknown name \"{unknown[0]}\" at 'queued_resource'."
            )
        for output_only in ("name", "createTime", "state"):
            spec.pop(output_only, None)
        if "spot" in spec and "guaranteed" in spec:
            raise invalid("Only one of spot or guaranteed may be set.")
        node_specs = spec.get("tpu", {}).get("nodeSpec", [])
        if not node_specs:
            raise invalid("tpu.nodeSpec must contain at least one node spec.")
        planned: list[tuple[str, Json, bool]] = []
        for node_spec in node_specs:
            node_parent = node_spec.get("parent") or parent
            node = self._node_body(node_spec.get("node"))
            node_spec["node"] = copy.deepcopy(node)
            if "spot" in spec:
                node.setdefault("schedulingConfig", {})["spot"] = True
            if spec.get("reservationName"):
                node.setdefault("schedulingConfig", {})["reserved"] = True
            multi = node_spec.get("multisliceParams")
            if bool(node_spec.get("nodeId")) == bool(multi):
                raise invalid("Exactly one of nodeSpec.nodeId or nodeSpec.multisliceParams must be set.")
            if multi:
                count = int(multi.get("nodeCount", 0))
                if count < 1:
                    raise invalid("multisliceParams.nodeCount must be at least 1.")
                prefix = multi.get("nodeIdPrefix") or name.rsplit("/", 1)[1]
                ids = [f"{prefix}-{i}" for i in range(count)]
            else:
                ids = [str(node_spec["nodeId"])]
            for node_id in ids:
                self._check_id(node_id, "nodeId")
                node_name = f"{node_parent}/nodes/{node_id}"
                self._new_node(node_name, node)  # validates type and runtime now, so errors are synchronous
                planned.append((node_name, node, bool(multi)))
        return spec, planned

    def _advance_queued(self, queued: _Queued) -> None:
        """Move one step along ``queued_states``: nodes appear at PROVISIONING and become READY at ACTIVE."""
        if queued.state not in self.queued_states[:-1]:
            return
        next_state = self.queued_states[self.queued_states.index(queued.state) + 1]
        if queued.fail_with is not None and queued.state in ("ACCEPTED", "WAITING_FOR_RESOURCES", "CREATING"):
            self._fail_queued_now(queued, queued.fail_with)
            return
        self._enter_state(queued, next_state)
        self._set_queued_state(queued, next_state, "SERVICE")

    def _enter_state(self, queued: _Queued, state: str) -> None:
        """The node side of a queued resource's state: CREATING nodes at PROVISIONING, READY ones at
        ACTIVE."""
        if state in ("PROVISIONING", "ACTIVE"):
            for node_name, node, multi in self._planned.get(queued.name, []):
                if node_name not in self._nodes:
                    self._nodes[node_name] = self._new_node(
                        node_name, node, queued=queued.name, multislice=multi
                    )
        if state == "ACTIVE":
            for node_name in queued.node_names:
                if node_name in self._nodes and self._nodes[node_name]["state"] == "CREATING":
                    self._make_ready(node_name)

    def _set_queued_state(self, queued: _Queued, state: str, initiator: str) -> None:
        queued.state, queued.initiator, queued.views = state, initiator, 0

    def _fail_queued_now(self, queued: _Queued, error: ApiError) -> None:
        queued.error = error.rpc_status()
        queued.fail_with = None
        self._set_queued_state(queued, "FAILED", "SERVICE")
        self._drop_nodes(queued.node_names)

    def _delete_queued(self, name: str, call: _Call) -> Json:
        queued = self._queued.get(name)
        if queued is None:
            raise not_found(name)
        force = call.query.get("force", "").lower() == "true"
        live = [n for n in queued.node_names if n in self._nodes]
        if live and not force:
            raise ApiError(
                "FAILED_PRECONDITION",
                f"Queued resource '{name}' has TPU nodes {live}; delete them first or set force=true.",
            )
        if queued.state == "DELETING":
            raise ApiError("FAILED_PRECONDITION", f"Queued resource '{name}' is already being deleted.")
        if queued.state == "SUSPENDING":  # the rig's reading: not deleted mid-transition (docs/gcp.md)
            raise ApiError(
                "FAILED_PRECONDITION", f"Queued resource '{name}' is SUSPENDING; delete it once SUSPENDED."
            )
        untaken = self._untaken_delete(name, call)
        if untaken is not None:
            return untaken
        self._set_queued_state(queued, "DELETING", "USER")
        for node_name in live:
            self._nodes[node_name]["state"] = "DELETING"
            self._nodes[node_name].pop("health", None)

        def finish() -> Json:
            self._drop_nodes(queued.node_names)
            self._queued.pop(name, None)
            self._planned.pop(name, None)
            return {}

        return self._start_operation(self._parent_of(name), name, "delete", EMPTY_TYPE, finish, call.ints)

    def _untaken_delete(self, name: str, call: _Call) -> Json | None:
        """A delete armed by ``deletes_do_not_take``: its operation, which ends done leaving ``name`` as it
        was; None for a delete that takes."""
        if self._deletes_not_taking <= 0:
            return None
        self._deletes_not_taking -= 1
        return self._start_operation(self._parent_of(name), name, "delete", EMPTY_TYPE, lambda: {}, call.ints)

    def _find_queued(self, queued_id: str | None) -> _Queued | None:
        if queued_id is None:
            return None
        if queued_id.startswith("projects/"):
            return self._queued.get(queued_id)
        matches = [q for name, q in self._queued.items() if name.rsplit("/", 1)[1] == queued_id]
        return matches[0] if len(matches) == 1 else None

    # ---- helpers ------------------------------------------------------------------------------------------

    @staticmethod
    def _check_id(value: str, what: str) -> None:
        if not ID_PATTERN.fullmatch(value):
            raise invalid(
                f"Invalid {what} '{value}': must be 1-63 lowercase letters, digits or hyphens, "
                "starting with a letter and not ending with a hyphen."
            )

    @staticmethod
    def _parent_of(name: str) -> str:
        return "/".join(name.split("/")[:4])

    @staticmethod
    def _page(items: list[Json], key: str, query: dict[str, str]) -> Json:
        """pageSize/pageToken paging (the client's pager follows nextPageToken); empty lists are omitted."""
        try:
            start = int(query.get("pageToken") or 0)
            size = int(query.get("pageSize") or 0)
        except ValueError:
            raise invalid("Invalid pageToken or pageSize.") from None
        end = len(items) if size <= 0 else start + size
        out: Json = {key: items[start:end]} if items[start:end] else {}
        if end < len(items):
            out["nextPageToken"] = str(end)
        return out
