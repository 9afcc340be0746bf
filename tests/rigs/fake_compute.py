"""A local stand-in for the Compute Engine v1 REST API, as far as TPU slices use it, that the real
``google-cloud-compute`` client (and gcloud, pointed here with ``CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE``)
talks to.

Nothing here reaches Google. It serves, under ``/compute/v1/projects/P``: ``global/instanceTemplates``,
``regions/R/resourcePolicies``, ``zones/Z/instanceGroupManagers`` (with ``listManagedInstances``),
``zones/Z/instances`` (``get``, ``list`` with a ``labels.K=V`` filter, ``getGuestAttributes``,
``setMetadata``, ``stop``, ``start``, ``simulateMaintenanceEvent``, ``delete``) and the zone, region and
global ``operations``. Resources are the JSON the client sent, with the output fields Compute Engine adds
(``id``, ``selfLink``, ``status``, ``networkIP``/``natIP``, the metadata ``fingerprint``).

What it does as Compute Engine does, because the code under test depends on it:

* Mutations answer an Operation (``status`` RUNNING) that is DONE on its ``operation_polls``-th GET; a
  failure is an operation ending with ``error.errors[{code, message}]`` (a stockout:
  ``ZONE_RESOURCE_POOL_EXHAUSTED``), not an HTTP error.
* A MIG made with a workload policy creates its hosts together (all or none); while the zone is stocked out
  (``stockout``) its managed instances stay ``CREATING`` with the stockout in ``lastAttempt.errors``, and the
  MIG tries again on each read. The workload policy's ``acceleratorTopology`` must hold the MIG's hosts'
  chips (``2x2x2`` = 8 chips = 2 ``tpu7x-standard-4t`` hosts), else 400.
* Each TPU host's metadata carries ``tpu-env`` with its ``TPU_WORKER_ID`` (and ``accelerator-type``, written
  ``v7x-16`` as seen on real VMs). Worker ids are given so that the instance names' order is the *reverse* of
  the worker order: code that orders hosts by name is caught.
* Guest attributes (the ``hostkeys`` namespace, from ``host_keys``) are served only for an instance whose
  metadata has ``enable-guest-attributes=TRUE``; otherwise 404, as Compute Engine answers.
* ``setMetadata`` needs the current ``fingerprint`` (else 412 conditionNotMet) and changes it.
* A template or policy that a MIG or instance still uses cannot be deleted (400,
  resourceInUseByAnotherResource).
* ``stop`` (or ``preempt``, a spot preemption with termination action STOP) takes an instance to TERMINATED.

Addresses: hosts get ``worker_addresses`` (the sshd pod's) in worker order, slice after slice.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final
from urllib.parse import parse_qsl, unquote, urlsplit

from tests.rigs.fake_tpu import ApiError, RecordedRequest, not_found
from tests.rigs.json_server import Json, JsonApiServer

BASE: Final = "https://www.googleapis.com/compute/v1"
CHIPS: Final[dict[str, int]] = {
    "tpu7x-standard-1t": 1,
    "tpu7x-standard-4t": 4,
    "ct6e-standard-1t": 1,
    "ct6e-standard-4t": 4,
    "ct6e-standard-8t": 8,
    "ct5p-hightpu-4t": 4,
}
"""The TPU machine types and their chips per VM (tpuft/core/compute_tpus.py has the sources)."""
ROUTE: Final = re.compile(
    r"/compute/v1/projects/(?P<project>[^/]+)/(?:(?P<scope>zones|regions)/(?P<where>[^/]+)/|global/)"
    r"(?P<collection>instanceTemplates|resourcePolicies|instanceGroupManagers|instances|operations)"
    r"(?:/(?P<name>[^/]+))?(?:/(?P<verb>[A-Za-z]+))?$"
)
LOOKUPS: Final = re.compile(
    r"/compute/v1/projects/(?P<project>[^/]+)/(?:global/images/family/(?P<family>[^/]+)|zones/(?P<zone>[^/]+))"
)
"""What gcloud reads before it creates: the image of a family (``--image-family``), the zone."""
STOCKOUT: Final = "ZONE_RESOURCE_POOL_EXHAUSTED"


@dataclass
class _Operation:
    name: str
    scope: str
    """``zones/Z``, ``regions/R`` or ``global``."""
    target: str
    kind: str
    polls_left: int
    finish: Any
    done: bool = False
    error: list[Json] | None = None

    def complete(self) -> None:
        if self.done:
            return
        try:
            self.finish()
        except ApiError as exc:
            self.error = [{"code": exc.status, "message": exc.message}]
        self.done = True

    def render(self, project: str) -> Json:
        out: Json = {
            "kind": "compute#operation",
            "id": str(int(hashlib.sha1(self.name.encode()).hexdigest()[:12], 16)),
            "name": self.name,
            "operationType": self.kind,
            "targetLink": self.target,
            "status": "DONE" if self.done else "RUNNING",
            "progress": 100 if self.done else 0,
            "selfLink": f"{BASE}/projects/{project}/{self.scope}/operations/{self.name}",
        }
        if self.scope.startswith("zones/"):
            out["zone"] = f"{BASE}/projects/{project}/{self.scope}"
        elif self.scope.startswith("regions/"):
            out["region"] = f"{BASE}/projects/{project}/{self.scope}"
        if self.error:
            out["error"] = {"errors": copy.deepcopy(self.error)}
            out["httpErrorStatusCode"] = 400
        return out


class FakeComputeServer(JsonApiServer):
    """The fake Compute Engine API. ``with FakeComputeServer() as server:`` serves on ``server.endpoint``."""

    def __init__(self, *, operation_polls: int = 1) -> None:
        self.operation_polls = operation_polls
        self.worker_addresses: list[str] | None = None
        """Addresses handed to hosts in worker order (then reused cyclically); None = 127.0.1.(10+i)."""
        self.host_keys: dict[str, str] = {}
        """Host address -> its public host key line (``ssh-ed25519 AAAA...``), published as guest
        attributes."""
        self.simulated_notice_s = 60.0
        """How far ahead of now ``simulateMaintenanceEvent`` announces its window."""
        self.stockout: dict[str, int] = {}
        """Zone -> how many more create attempts fail for want of capacity (a MIG tries once per read)."""
        self.requests: list[RecordedRequest] = []
        super().__init__("fake-compute")
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._templates: dict[str, Json] = {}
            self._policies: dict[tuple[str, str], Json] = {}
            self._groups: dict[tuple[str, str], Json] = {}
            self._instances: dict[tuple[str, str], Json] = {}
            self._operations: dict[str, _Operation] = {}
            self._ids = itertools.count(1001)
            self._ops = itertools.count(1)
            self._project = ""
            self.requests = []
            self.maintenance_events: list[str] = []

    # ---- test controls ------------------------------------------------------------------------------------
    def preempt(self, instance: str, zone: str | None = None) -> None:
        """A spot preemption with termination action STOP: the instance is TERMINATED."""
        with self._lock:
            self._instance(zone, instance)["status"] = "TERMINATED"

    def backdate(self, seconds: float) -> None:
        """Make every template and instance ``seconds`` older (what an idle cluster looks like to gc)."""
        with self._lock:
            for resource in [*self._templates.values(), *self._instances.values()]:
                then = datetime.fromisoformat(resource["creationTimestamp"]).timestamp() - seconds
                resource["creationTimestamp"] = _stamp(then)

    def instances(self) -> list[Json]:
        with self._lock:
            return [copy.deepcopy(i) for i in self._instances.values()]

    def resources(self) -> dict[str, list[str]]:
        """What exists, by collection: what a test of ``delete`` or ``gc`` reads back."""
        with self._lock:
            return {
                "instanceTemplates": sorted(self._templates),
                "resourcePolicies": sorted(name for _, name in self._policies),
                "instanceGroupManagers": sorted(name for _, name in self._groups),
                "instances": sorted(name for _, name in self._instances),
            }

    def calls(self, rpc: str) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.rpc == rpc]

    # ---- HTTP entry ---------------------------------------------------------------------------------------
    def handle(self, method: str, raw_path: str, raw_body: bytes) -> tuple[int, Json]:
        import json

        parts = urlsplit(raw_path)
        path = unquote(parts.path)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        with self._lock:
            rpc = "Unknown"
            body: Any = None
            try:
                body = json.loads(raw_body) if raw_body.strip() else None
                match = ROUTE.fullmatch(path)
                looked_up = LOOKUPS.fullmatch(path)
                if looked_up is not None and method == "GET":
                    rpc, run = self._lookup(looked_up)
                elif match is None:
                    raise not_found(path)
                else:
                    rpc, run = self._route(method, match, query, body)
                status, payload = 200, run()
            except ApiError as exc:
                status, payload = exc.http, exc.body()
            except ValueError as exc:
                status, payload = 400, {"error": {"code": 400, "message": f"Invalid JSON payload. {exc}"}}
            self.requests.append(RecordedRequest(method, path, query, body, status, rpc))
            return status, payload

    def _route(self, method: str, match: re.Match[str], query: dict[str, str], body: Any) -> tuple[str, Any]:
        project, scope, where = match["project"], match["scope"], match["where"]
        collection, name, verb = match["collection"], match["name"], match["verb"]
        self._project = project
        place = f"{scope}/{where}" if scope else "global"
        table = {
            ("instanceTemplates", "POST", False): (
                "instanceTemplates.insert",
                lambda: self._insert_template(body),
            ),
            ("instanceTemplates", "GET", True): ("instanceTemplates.get", lambda: self._get_template(name)),
            ("instanceTemplates", "GET", False): (
                "instanceTemplates.list",
                lambda: _listing("instanceTemplateList", self._templates.values()),
            ),
            ("instanceGroupManagers", "GET", False): (
                "instanceGroupManagers.list",
                lambda: _listing(
                    "instanceGroupManagerList",
                    (self._get_group(z, n) for z, n in list(self._groups) if z == where),
                ),
            ),
            ("instanceTemplates", "DELETE", True): (
                "instanceTemplates.delete",
                lambda: self._delete_template(name),
            ),
            ("resourcePolicies", "POST", False): (
                "resourcePolicies.insert",
                lambda: self._insert_policy(where, body),
            ),
            ("resourcePolicies", "GET", True): (
                "resourcePolicies.get",
                lambda: self._get_policy(where, name),
            ),
            ("resourcePolicies", "DELETE", True): (
                "resourcePolicies.delete",
                lambda: self._delete_policy(where, name),
            ),
            ("instanceGroupManagers", "POST", False): (
                "instanceGroupManagers.insert",
                lambda: self._insert_group(where, body),
            ),
            ("instanceGroupManagers", "GET", True): (
                "instanceGroupManagers.get",
                lambda: self._get_group(where, name),
            ),
            ("instanceGroupManagers", "DELETE", True): (
                "instanceGroupManagers.delete",
                lambda: self._delete_group(where, name),
            ),
            ("instances", "POST", False): (
                "instances.insert",
                lambda: self._insert_instance(where, body, query),
            ),
            ("instances", "GET", False): ("instances.list", lambda: self._list_instances(where, query)),
            ("instances", "GET", True): ("instances.get", lambda: self._get_instance(where, name)),
            ("instances", "DELETE", True): ("instances.delete", lambda: self._delete_instance(where, name)),
            ("operations", "GET", True): ("operations.get", lambda: self._get_operation(name)),
        }
        if verb:
            verbs = {
                ("instanceGroupManagers", "listManagedInstances"): lambda: self._list_managed(where, name),
                ("instances", "getGuestAttributes"): lambda: self._guest_attributes(where, name, query),
                ("instances", "setMetadata"): lambda: self._set_metadata(where, name, body),
                ("instances", "stop"): lambda: self._set_status(where, name, "TERMINATED", "stop"),
                ("instances", "start"): lambda: self._set_status(where, name, "RUNNING", "start"),
                ("instances", "simulateMaintenanceEvent"): lambda: self._simulate_maintenance(where, name),
                ("operations", "wait"): lambda: self._wait_operation(name),
            }
            run = verbs.get((collection, verb))
            if run is None:
                raise not_found(f"{collection}/{name}/{verb}")
            return f"{collection}.{verb}", run
        entry = table.get((collection, method, name is not None))
        if entry is None or (collection == "operations" and not place):
            raise not_found(match.group(0))
        return entry

    def _lookup(self, match: re.Match[str]) -> tuple[str, Any]:
        project = match["project"]
        if match["family"]:
            family = match["family"]
            image = {
                "kind": "compute#image",
                "name": f"{family}-v20260320",
                "family": family,
                "status": "READY",
                "selfLink": f"{BASE}/projects/{project}/global/images/{family}-v20260320",
            }
            return "images.getFromFamily", lambda: image
        zone = match["zone"]
        region = zone.rsplit("-", 1)[0]
        answer = {
            "kind": "compute#zone",
            "name": zone,
            "status": "UP",
            "region": f"{BASE}/projects/{project}/regions/{region}",
            "selfLink": f"{BASE}/projects/{project}/zones/{zone}",
        }
        return "zones.get", lambda: answer

    # ---- operations ---------------------------------------------------------------------------------------
    def _operation(self, scope: str, target: str, kind: str, finish: Any) -> Json:
        op = _Operation(f"operation-{next(self._ops):06d}", scope, target, kind, self.operation_polls, finish)
        self._operations[op.name] = op
        if op.polls_left <= 0:
            op.complete()
        return op.render(self._project)

    def _get_operation(self, name: str) -> Json:
        op = self._operations.get(name)
        if op is None:
            raise not_found(f"operations/{name}")
        op.polls_left -= 1
        if op.polls_left <= 0:
            op.complete()
        return op.render(self._project)

    def _wait_operation(self, name: str) -> Json:
        op = self._operations.get(name)
        if op is None:
            raise not_found(f"operations/{name}")
        op.complete()
        return op.render(self._project)

    # ---- templates and policies ---------------------------------------------------------------------------
    def _link(self, scope: str, collection: str, name: str) -> str:
        return f"{BASE}/projects/{self._project}/{scope}/{collection}/{name}"

    def _insert_template(self, body: Json) -> Json:
        name = str(body.get("name", ""))
        properties = body.get("properties") or {}
        machine = str(properties.get("machineType", "")).rsplit("/", 1)[-1]
        if machine not in CHIPS:
            raise ApiError(
                "INVALID_ARGUMENT", f"Invalid value for field 'resource.properties.machineType': '{machine}'."
            )
        disks = properties.get("disks") or []
        if not any((d.get("initializeParams") or {}).get("sourceImage") for d in disks if d.get("boot")):
            raise ApiError(
                "INVALID_ARGUMENT",
                "Required field 'resource.properties.disks[0].initializeParams.sourceImage' not specified",
            )
        if name in self._templates:
            raise ApiError(
                "ALREADY_EXISTS",
                f"The resource '{self._link('global', 'instanceTemplates', name)}' already exists",
            )
        template = {**copy.deepcopy(body), "id": str(next(self._ids)), "kind": "compute#instanceTemplate"}
        template["creationTimestamp"] = _stamp(time.time())
        template["selfLink"] = self._link("global", "instanceTemplates", name)
        target = template["selfLink"]
        return self._operation(
            "global", target, "insert", lambda: self._templates.__setitem__(name, template)
        )

    def _get_template(self, name: str) -> Json:
        if name not in self._templates:
            raise not_found(self._link("global", "instanceTemplates", name))
        return copy.deepcopy(self._templates[name])

    def _delete_template(self, name: str) -> Json:
        link = self._link("global", "instanceTemplates", name)
        if name not in self._templates:
            raise not_found(link)
        users = [g["name"] for g in self._groups.values() if g["instanceTemplate"].endswith(f"/{name}")]
        if users:
            raise ApiError(
                "INVALID_ARGUMENT",
                f"The instance_template resource '{link}' is already being used by "
                f"'{self._link('zones/-', 'instanceGroupManagers', users[0])}'",
            )
        return self._operation("global", link, "delete", lambda: self._templates.pop(name, None))

    def _insert_policy(self, region: str, body: Json) -> Json:
        name = str(body.get("name", ""))
        workload = body.get("workloadPolicy") or {}
        if workload and workload.get("type") not in ("HIGH_THROUGHPUT", "HIGH_AVAILABILITY"):
            raise ApiError(
                "INVALID_ARGUMENT",
                f"Invalid value for field 'resource.workloadPolicy.type': '{workload.get('type')}'.",
            )
        if (region, name) in self._policies:
            raise ApiError(
                "ALREADY_EXISTS",
                f"The resource '{self._link(f'regions/{region}', 'resourcePolicies', name)}' already exists",
            )
        policy = {
            **copy.deepcopy(body),
            "id": str(next(self._ids)),
            "region": f"{BASE}/projects/{self._project}/regions/{region}",
        }
        policy["selfLink"] = self._link(f"regions/{region}", "resourcePolicies", name)
        policy["status"] = "READY"
        return self._operation(
            f"regions/{region}",
            policy["selfLink"],
            "insert",
            lambda: self._policies.__setitem__((region, name), policy),
        )

    def _get_policy(self, region: str, name: str) -> Json:
        if (region, name) not in self._policies:
            raise not_found(self._link(f"regions/{region}", "resourcePolicies", name))
        return copy.deepcopy(self._policies[(region, name)])

    def _delete_policy(self, region: str, name: str) -> Json:
        link = self._link(f"regions/{region}", "resourcePolicies", name)
        if (region, name) not in self._policies:
            raise not_found(link)
        users = [
            g["name"]
            for g in self._groups.values()
            if str((g.get("resourcePolicies") or {}).get("workloadPolicy", "")).endswith(f"/{name}")
        ]
        if users:
            raise ApiError(
                "INVALID_ARGUMENT",
                f"The resource_policy resource '{link}' is already being used by '{users[0]}'",
            )
        return self._operation(
            f"regions/{region}", link, "delete", lambda: self._policies.pop((region, name), None)
        )

    # ---- groups -------------------------------------------------------------------------------------------
    def _template_of(self, url: str) -> Json:
        name = url.rsplit("/", 1)[-1]
        if name not in self._templates:
            raise ApiError(
                "INVALID_ARGUMENT",
                f"Invalid value for field 'resource.instanceTemplate': '{url}'. The referenced "
                "instanceTemplate resource cannot be found.",
            )
        return self._templates[name]

    def _insert_group(self, zone: str, body: Json) -> Json:
        name = str(body.get("name", ""))
        template = self._template_of(str(body.get("instanceTemplate", "")))
        size = int(body.get("targetSize") or 0)
        url = str((body.get("resourcePolicies") or {}).get("workloadPolicy", ""))
        if url:
            policy = (
                self._policies.get((url.split("/regions/")[1].split("/")[0], url.rsplit("/", 1)[-1]))
                if "/regions/" in url
                else None
            )
            if policy is None:
                raise ApiError("INVALID_ARGUMENT", f"The referenced workload policy '{url}' cannot be found.")
            topology = str((policy.get("workloadPolicy") or {}).get("acceleratorTopology", ""))
            chips = 1
            for dim in topology.split("x") if topology else []:
                chips *= int(dim)
            per_host = CHIPS[template["properties"]["machineType"].rsplit("/", 1)[-1]]
            if chips != size * per_host:
                raise ApiError(
                    "INVALID_ARGUMENT",
                    f"Accelerator topology {topology} needs {chips // per_host} VMs of machine type "
                    f"{template['properties']['machineType']}; targetSize is {size}.",
                )
        if (zone, name) in self._groups:
            raise ApiError(
                "ALREADY_EXISTS",
                f"The resource '{self._link(f'zones/{zone}', 'instanceGroupManagers', name)}' already exists",
            )
        group = {
            **copy.deepcopy(body),
            "id": str(next(self._ids)),
            "zone": f"{BASE}/projects/{self._project}/zones/{zone}",
        }
        group["selfLink"] = self._link(f"zones/{zone}", "instanceGroupManagers", name)
        group.setdefault("baseInstanceName", name)  # the API's default, which gcloud relies on
        group["_members"] = []
        group["_errors"] = []

        def made() -> None:
            self._groups[(zone, name)] = group
            self._fill_group(zone, group)

        return self._operation(f"zones/{zone}", group["selfLink"], "insert", made)

    def _fill_group(self, zone: str, group: Json) -> None:
        """Try to make the group's hosts, all together (a workload policy's slice is all or none)."""
        if group["_members"]:
            return
        if self.stockout.get(zone, 0) > 0:
            self.stockout[zone] -= 1
            said = f"{_no_capacity(self._project, zone)} Try a different zone, or try again later."
            group["_errors"] = [{"code": STOCKOUT, "message": said}]
            return
        group["_errors"] = []
        template = self._template_of(group["instanceTemplate"])
        size = int(group.get("targetSize") or 0)
        base = group["baseInstanceName"]
        # names sort in the reverse of worker order: the host with worker id 0 gets the last name
        for worker in range(size):
            unique = hashlib.sha1(f"{base}{worker}{next(self._ids)}".encode()).hexdigest()[:3]
            suffix = f"{chr(ord('z') - worker)}{unique}"
            instance = self._new_instance(zone, f"{base}-{suffix}", template, worker, size)
            group["_members"].append(instance["name"])

    def _get_group(self, zone: str, name: str) -> Json:
        group = self._groups.get((zone, name))
        if group is None:
            raise not_found(self._link(f"zones/{zone}", "instanceGroupManagers", name))
        self._fill_group(zone, group)
        out = {k: copy.deepcopy(v) for k, v in group.items() if not k.startswith("_")}
        out["status"] = {"isStable": len(group["_members"]) == int(group.get("targetSize") or 0)}
        return out

    def _list_managed(self, zone: str, name: str) -> Json:
        group = self._groups.get((zone, name))
        if group is None:
            raise not_found(self._link(f"zones/{zone}", "instanceGroupManagers", name))
        self._fill_group(zone, group)
        if not group["_members"]:
            return {
                "managedInstances": [
                    {
                        "currentAction": "CREATING",
                        "lastAttempt": {"errors": {"errors": copy.deepcopy(group["_errors"])}},
                    }
                    for _ in range(int(group.get("targetSize") or 0))
                ]
            }
        managed = []
        for member in group["_members"]:
            instance = self._instances[(zone, member)]
            managed.append(
                {
                    "instance": instance["selfLink"],
                    "name": member,
                    "id": instance["id"],
                    "instanceStatus": instance["status"],
                    "currentAction": "NONE",
                }
            )
        return {"managedInstances": managed}

    def _delete_group(self, zone: str, name: str) -> Json:
        link = self._link(f"zones/{zone}", "instanceGroupManagers", name)
        group = self._groups.get((zone, name))
        if group is None:
            raise not_found(link)

        def gone() -> None:
            for member in group["_members"]:
                self._instances.pop((zone, member), None)
            self._groups.pop((zone, name), None)

        return self._operation(f"zones/{zone}", link, "delete", gone)

    # ---- instances ----------------------------------------------------------------------------------------
    def _addresses_in_use(self) -> set[str]:
        return {i["networkInterfaces"][0]["networkIP"] for i in self._instances.values()}

    def _next_address(self) -> str:
        in_use = self._addresses_in_use()
        pool = self.worker_addresses or [f"127.0.1.{10 + i}" for i in range(200)]
        free = [a for a in pool if a not in in_use]
        return free[0] if free else pool[len(self._instances) % len(pool)]

    def _new_instance(self, zone: str, name: str, template: Json, worker: int, hosts: int) -> Json:
        properties = copy.deepcopy(template.get("properties") or {})
        machine = str(properties.get("machineType", "")).rsplit("/", 1)[-1]
        address = self._next_address()
        items = list((properties.get("metadata") or {}).get("items") or [])
        family = (
            machine.split("-", 1)[0].replace("ct6e", "v6e").replace("ct5p", "v5p").replace("tpu7x", "v7x")
        )
        cores = CHIPS[machine] * hosts * (2 if family in ("v7x", "v5p") else 1)
        items += [
            {"key": "accelerator-type", "value": f"{family}-{cores}"},
            {
                "key": "tpu-env",
                "value": f"TPU_WORKER_ID: '{worker}'\n"
                f"TPU_ACCELERATOR_TYPE: '{family.replace('v7x', 'tpu7x')}-{cores}'\n",
            },
        ]
        interface = copy.deepcopy((properties.get("networkInterfaces") or [{}])[0])
        interface["networkIP"] = address
        for config in interface.get("accessConfigs") or []:
            config["natIP"] = address
        instance = {
            **properties,
            "kind": "compute#instance",
            "name": name,
            "id": str(next(self._ids)),
            "status": "RUNNING",
            "creationTimestamp": _stamp(time.time()),
            "zone": f"{BASE}/projects/{self._project}/zones/{zone}",
            "machineType": f"{BASE}/projects/{self._project}/zones/{zone}/machineTypes/{machine}",
            "metadata": {"items": items, "fingerprint": _fingerprint(items)},
            "networkInterfaces": [interface],
            "selfLink": self._link(f"zones/{zone}", "instances", name),
        }
        self._instances[(zone, name)] = instance
        return instance

    def _instance(self, zone: str | None, name: str) -> Json:
        for (where, instance_name), instance in self._instances.items():
            if instance_name == name and (zone is None or zone == where):
                return instance
        raise not_found(self._link(f"zones/{zone or '-'}", "instances", name))

    def _insert_instance(self, zone: str, body: Json, query: dict[str, str]) -> Json:
        name = str(body.get("name", ""))
        source = query.get("sourceInstanceTemplate", "")
        if not source:
            raise ApiError(
                "INVALID_ARGUMENT", "fake_compute: only instances from a sourceInstanceTemplate are served"
            )
        template = self._template_of(source)
        if (zone, name) in self._instances:
            raise ApiError(
                "ALREADY_EXISTS",
                f"The resource '{self._link(f'zones/{zone}', 'instances', name)}' already exists",
            )
        link = self._link(f"zones/{zone}", "instances", name)

        def made() -> None:
            if self.stockout.get(zone, 0) > 0:
                self.stockout[zone] -= 1
                raise ApiError(
                    STOCKOUT,
                    _no_capacity(self._project, zone),
                )
            self._new_instance(zone, name, template, 0, 1)

        return self._operation(f"zones/{zone}", link, "insert", made)

    def _get_instance(self, zone: str, name: str) -> Json:
        return copy.deepcopy(self._instance(zone, name))

    def _list_instances(self, zone: str, query: dict[str, str]) -> Json:
        wanted = re.fullmatch(r'\s*labels\.([a-z0-9_-]+)\s*=\s*"?([a-z0-9_-]*)"?\s*', query.get("filter", ""))
        found = [
            copy.deepcopy(i)
            for (where, _), i in sorted(self._instances.items())
            if where == zone and (wanted is None or (i.get("labels") or {}).get(wanted[1]) == wanted[2])
        ]
        return {"kind": "compute#instanceList", "items": found} if found else {"kind": "compute#instanceList"}

    def _delete_instance(self, zone: str, name: str) -> Json:
        instance = self._instance(zone, name)
        return self._operation(
            f"zones/{zone}", instance["selfLink"], "delete", lambda: self._instances.pop((zone, name), None)
        )

    def _guest_attributes(self, zone: str, name: str, query: dict[str, str]) -> Json:
        instance = self._instance(zone, name)
        items = {i["key"]: i["value"] for i in instance["metadata"]["items"]}
        if str(items.get("enable-guest-attributes", "")).upper() != "TRUE":
            raise ApiError(
                "NOT_FOUND",
                "The resource 'guestAttributes' of the instance was not found (guest attributes are "
                "disabled)",
            )
        address = instance["networkInterfaces"][0]["networkIP"]
        published = self.host_keys.get(address, "")
        path = query.get("queryPath", "")
        entries = []
        for line in published.splitlines():
            kind, _, blob = line.strip().partition(" ")
            if kind and blob:
                entries.append({"namespace": "hostkeys", "key": kind, "value": blob.split()[0]})
        if path.rstrip("/") != "hostkeys" or not entries:
            raise ApiError(
                "NOT_FOUND", f"The resource 'guestAttributes/{path}' of instance '{name}' was not found"
            )
        return {"kind": "compute#guestAttributes", "queryPath": path, "queryValue": {"items": entries}}

    def _set_metadata(self, zone: str, name: str, body: Json) -> Json:
        instance = self._instance(zone, name)
        if body.get("fingerprint") != instance["metadata"]["fingerprint"]:
            raise ApiError(
                "FAILED_PRECONDITION",
                "Supplied fingerprint does not match current metadata fingerprint.",
                http=412,
            )
        items = list(body.get("items") or [])

        def changed() -> None:
            instance["metadata"] = {"items": items, "fingerprint": _fingerprint(items)}

        return self._operation(f"zones/{zone}", instance["selfLink"], "setMetadata", changed)

    def _set_status(self, zone: str, name: str, status: str, kind: str) -> Json:
        instance = self._instance(zone, name)
        return self._operation(
            f"zones/{zone}", instance["selfLink"], kind, lambda: instance.__setitem__("status", status)
        )

    def _simulate_maintenance(self, zone: str, name: str) -> Json:
        """Announce a window ``simulated_notice_s`` ahead in the instance's ``resourceStatus``."""
        instance = self._instance(zone, name)
        self.maintenance_events.append(name)
        start = time.time() + self.simulated_notice_s
        instance.setdefault("resourceStatus", {})["upcomingMaintenance"] = {
            "type": "UNSCHEDULED",
            "maintenanceStatus": "PENDING",
            "canReschedule": False,
            "windowStartTime": _stamp(start),
            "windowEndTime": _stamp(start + 60.0),
        }
        return self._operation(
            f"zones/{zone}", instance["selfLink"], "simulateMaintenanceEvent", lambda: None
        )


def _no_capacity(project: str, zone: str) -> str:
    return (
        f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available to fulfill "
        "the request."
    )


def _listing(kind: str, items: Any) -> Json:
    found = [copy.deepcopy(i) for i in items]
    return {"kind": f"compute#{kind}", "items": found} if found else {"kind": f"compute#{kind}"}


def _stamp(unix: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="milliseconds")


def _fingerprint(items: list[Json]) -> str:
    import base64
    import json

    return base64.b64encode(hashlib.sha1(json.dumps(items, sort_keys=True).encode()).digest()[:8]).decode()
