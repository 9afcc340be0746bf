"""One cluster's conversation with the Compute Engine API (``gcp.api: compute``): its clients, its
long-running operations, and the names of what tpuft creates there.

Why operations are polled here and not by the client: google-cloud-compute's ``insert()`` returns an
``ExtendedOperation`` whose polling client is built by the transport on the *default* endpoint
(``transports/base.py``: ``ZoneOperationsClient(credentials=..., transport=...)``, no client options), so with
``gcp.compute_api_endpoint`` set the create would go to the private endpoint and its polls to
compute.googleapis.com. tpuft sends the ``*_unary`` form of each call (the plain ``compute.Operation``) and
polls it through operations clients of its own, on the same endpoint as the call.

Calls go through :meth:`GoogleApi.call` as the Cloud TPU API's do: retries within the command's budget, and a
refusal said in one line naming the call, project and zone. An operation that ends with errors is said the
same way, its Compute Engine error codes read for the case users meet most (a zone out of capacity, a quota).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tpuft.core.records import Progress
from tpuft.core.waiting import waiting
from tpuft.providers.gcp import tuning
from tpuft.providers.gcp.api import GcpError, GoogleApi, rest_client
from tpuft.providers.gcp.buckets import region_of

COMPUTE_SERVICE = "compute.googleapis.com"
STOCKOUT_CODES = frozenset({"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"})
"""Compute Engine's words for a zone without capacity for the machine type (an operation's error code)."""
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED"})

_HINTS = {
    "NotFound": "check gcp.project and gcp.zone; what a project needs first: docs/compute-engine.md",
    "Forbidden": "the account in use may lack roles/compute.instanceAdmin.v1 (and "
    "compute.resourcePolicyAdmin) in the project; what a project needs first: docs/compute-engine.md",
    "TooManyRequests": "the API is rate-limiting this project (or a quota is used up): wait and try again",
    "BadRequest": "the API refused the request: check the accelerator, gcp.image and the zone",
    "Unauthenticated": "no valid credentials: run gcloud auth application-default login",
    "Conflict": "a resource with this name exists already (or is being changed): see tpuft status",
}
_CLIENTS = {
    "instances": "InstancesClient",
    "templates": "InstanceTemplatesClient",
    "policies": "ResourcePoliciesClient",
    "groups": "InstanceGroupManagersClient",
    "zone_operations": "ZoneOperationsClient",
    "region_operations": "RegionOperationsClient",
    "global_operations": "GlobalOperationsClient",
}


class ComputeApi(GoogleApi):
    """Compute Engine as one cluster sees it: ``name`` in ``project``/``zone`` as ``slices`` slices. Each
    slice is one instance (a single-host slice) or a managed instance group of its hosts; they share one
    instance template and (multi-host) one workload policy in the zone's region."""

    service = COMPUTE_SERVICE
    hints = _HINTS
    endpoint_env = "TPUFT_COMPUTE_API_ENDPOINT"

    @property
    def region(self) -> str:
        return region_of(self.zone)

    # -- names ---------------------------------------------------------------------------------------------
    @property
    def template_name(self) -> str:
        return f"{self.name}-tpuft"

    @property
    def policy_name(self) -> str:
        return f"{self.name}-tpuft"

    def template_url(self) -> str:
        return f"projects/{self.project}/global/instanceTemplates/{self.template_name}"

    def policy_url(self) -> str:
        return f"projects/{self.project}/regions/{self.region}/resourcePolicies/{self.policy_name}"

    # -- plumbing -------------------------------------------------------------------------------------------
    @property
    def endpoint_label(self) -> str:
        return f"the Compute Engine API at {self.endpoint or 'https://compute.googleapis.com'}"

    def client(self, kind: str) -> Any:
        """One of the Compute Engine clients (``instances``, ``templates``, ``policies``, ``groups``, and the
        three operations clients), every one on the same endpoint."""
        if kind not in self._clients:
            from google.cloud import compute_v1

            factory = getattr(compute_v1, _CLIENTS[kind])
            self._clients[kind] = rest_client(factory, self.endpoint, "the Compute Engine API")
        return self._clients[kind]

    def wait(
        self,
        what: str,
        operation: Any,
        progress: Progress | None = None,
        watch: Callable[[], str] | None = None,
    ) -> Any:
        """Poll a ``compute.Operation`` on this endpoint until it is DONE, saying what it waits for; an
        operation that ends with errors becomes one located line (:meth:`failure`)."""
        from google.cloud import compute_v1

        with waiting(
            f"the Compute Engine API to finish {what}", tuning.CREATE_TIMEOUT_S, progress=progress
        ) as w:
            while operation.status != compute_v1.Operation.Status.DONE:
                w.update(watch() if watch else "")
                if w.expired():
                    raise GcpError(
                        f"{what}: still not done after {tuning.CREATE_TIMEOUT_S:.0f}s",
                        hint="See: tpuft status",
                    )
                time.sleep(tuning.POLL_SECONDS)
                operation = self._poll(what, operation)
        if operation.error and operation.error.errors:
            raise self.failure(what, operation)
        return operation

    def _poll(self, what: str, operation: Any) -> Any:
        name = operation.name
        if operation.zone:
            return self.call(
                f"{what} (polling)",
                self.client("zone_operations").get,
                project=self.project,
                zone=operation.zone.rsplit("/", 1)[-1],
                operation=name,
            )
        if operation.region:
            return self.call(
                f"{what} (polling)",
                self.client("region_operations").get,
                project=self.project,
                region=operation.region.rsplit("/", 1)[-1],
                operation=name,
            )
        return self.call(
            f"{what} (polling)", self.client("global_operations").get, project=self.project, operation=name
        )

    def failure(self, what: str, operation: Any) -> GcpError:
        """A finished operation's errors as one line; ``kind`` says stockout, quota or the code itself."""
        errors = list(operation.error.errors)
        codes = [str(e.code) for e in errors]
        said = "; ".join(f"{e.code}: {e.message}" for e in errors)
        where = f"{what} in project {self.project}, zone {self.zone} failed"
        if STOCKOUT_CODES & set(codes):
            error = GcpError(
                f"{where}: the zone has no capacity for it now ({said})",
                hint="Try another zone, spot, or a reservation; or wait and run tpuft create again.",
            )
            error.kind = "stockout"  # type: ignore[attr-defined]
        elif QUOTA_CODES & set(codes):
            error = GcpError(
                f"{where}: a quota is used up ({said})",
                hint="Ask for more quota (IAM & Admin > Quotas) or pick a smaller slice or another region.",
            )
            error.kind = "quota"  # type: ignore[attr-defined]
        else:
            error = GcpError(f"{where}: {said}", hint="See: tpuft status")
            error.kind = codes[0] if codes else "error"  # type: ignore[attr-defined]
        error.problem = None  # type: ignore[attr-defined]
        return error
