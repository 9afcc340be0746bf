"""One cluster's conversation with the Cloud TPU API: the client, its retries and errors, and the resource
names.

Every call goes through ``TpuApi.call``: transient errors (UNAVAILABLE, 429, 500) and a network that does not
answer are retried with jittered backoff until the cluster file's ``gcp.timeout`` is spent (one budget for the
whole command, kept by :mod:`tpuft.storage.network`, which also bounds each request and the token refresh),
then become one line naming what was being done and the endpoint; the others become one line naming the
project, zone and call, with the likely fix, which for what a project lacks (the API enabled, a role, quota,
billing, an organization policy) is read from the error's reason fields (:mod:`tpuft.storage.google_errors`).
A call that takes longer than 2 s says what it waits for (:func:`tpuft.storage.network.cloud_call`). The
client is built lazily (the CLI never imports Google's libraries at start-up). ``gcp.tpu_api_endpoint`` (or
``$TPUFT_TPU_API_ENDPOINT``) points it at a private endpoint; anonymous credentials are used only for a
loopback ``http://`` endpoint, which is how the tests talk to a fake TPU API server.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from tpuft.core.errors import TpuftError
from tpuft.core.records import Progress
from tpuft.core.waiting import waiting
from tpuft.providers.gcp import tuning
from tpuft.storage.google_errors import project_problem
from tpuft.storage.network import (
    CLOCK,
    DEFAULT_TIMEOUT_S,
    budget_session,
    cloud_call,
    is_network_error,
    unreachable,
)

T = TypeVar("T")
TPU_SERVICE = "tpu.googleapis.com"

_HINTS = {
    "NotFound": "check gcp.project and gcp.zone; what a project needs first: docs/gcp.md",
    "PermissionDenied": "the account in use may lack roles/tpu.admin in the project (gcloud auth "
    "application-default login?); what a project needs first: docs/gcp.md",
    "Forbidden": "the account in use may lack roles/tpu.admin in the project (gcloud auth "
    "application-default login?); what a project needs first: docs/gcp.md",
    "ResourceExhausted": "no quota or no capacity for this shape here: try another zone, spot, or "
    "gcp.queued: true",
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


class GoogleApi:
    """What the cluster's calls to one Google API share, whichever API it is (the Cloud TPU API here, Compute
    Engine in :mod:`.compute_api`): the retries within the command's budget, and a refusal said as one line
    naming the call, project and zone with its likely fix. A subclass names its ``service`` and its
    ``endpoint_label``."""

    service = TPU_SERVICE
    hints: dict[str, str] = _HINTS
    endpoint_env = "TPUFT_TPU_API_ENDPOINT"
    """The variable that points the API elsewhere when the cluster file does not."""

    def __init__(
        self,
        project: str,
        zone: str,
        name: str,
        slices: int,
        endpoint: str | None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        # this process is the controller, with a cluster file: its cloud calls get the budget
        CLOCK.arm(timeout)
        self.project = project
        self.zone = zone
        self.name = name
        self.slices = slices
        self._configured_endpoint = endpoint
        self._clients: dict[str, Any] = {}
        """The API's clients, built on first use (the CLI never imports Google's libraries at start-up)."""

    def slice_ids(self) -> list[str]:
        """Each slice's name: the cluster's (one slice), or ``name-0``, ``name-1``, ... (multislice): a node
        of the Cloud TPU API, an instance or a managed instance group of Compute Engine."""
        if self.slices > 1:
            return [f"{self.name}-{i}" for i in range(self.slices)]
        return [self.name]

    @property
    def endpoint(self) -> str | None:
        return self._configured_endpoint or os.environ.get(self.endpoint_env) or None

    @property
    def endpoint_label(self) -> str:
        raise NotImplementedError

    def call(self, what: str, fn: Callable[..., T], *args: Any, missing_ok: bool = False, **kwargs: Any) -> T:
        """One API call with retries for transient errors and a clear message for the rest.
        With ``missing_ok``, NotFound is raised as it is, for callers to which absence is an answer."""
        from google.api_core import exceptions as gexc

        transient = (
            gexc.ServiceUnavailable,
            gexc.TooManyRequests,
            gexc.InternalServerError,
            gexc.GatewayTimeout,
        )
        located = _located(what, kwargs)
        with cloud_call(self.endpoint_label, located) as call:
            attempt = 0
            while True:
                started = time.monotonic()
                try:
                    result = fn(*args, **kwargs)
                    CLOCK.answered()
                    return result
                except gexc.NotFound as exc:
                    CLOCK.answered()
                    if missing_ok:
                        raise
                    raise self.explain(located, exc) from None
                except Exception as exc:  # sorted below: transient, the network's, or the API's answer
                    network = is_network_error(exc)
                    lasting = project_problem(exc, service=self.service, project=self.project, zone=self.zone)
                    if lasting is not None and lasting.lasting and not network:
                        raise self.explain(located, exc) from None
                    if not network and not isinstance(exc, transient):
                        if isinstance(exc, gexc.GoogleAPICallError):
                            raise self.explain(located, exc) from None
                        raise
                    if (
                        not call.failing_for()
                    ):  # an answer (a 503) that the transport did not see as a failure
                        CLOCK.failed(started)
                        call.failed(started, self.endpoint_label, type(exc).__name__)
                    left = CLOCK.remaining() or 0.0
                    # jittered (half to all of the doubling step): many callers refused by one 429 (a rate
                    # limit) do not all come back in the same second
                    step = tuning.RETRY_BASE_S * 2**attempt * random.uniform(0.5, 1.0)
                    pause = min(step, 30.0, left)
                    if left <= 0 or pause <= 0:
                        if network:
                            raise unreachable(located, exc, endpoint=self.endpoint_label) from None
                        raise self.explain(f"{located} (after {attempt + 1} tries)", exc) from None
                    attempt += 1
                    time.sleep(pause)

    def explain(self, what: str, exc: BaseException) -> GcpError:
        """The API's refusal as one line naming the call, project and zone. What the project lacks (the API
        enabled, a role, quota, billing, an organization policy's leave) is read from the error's own reason
        fields (:mod:`tpuft.storage.google_errors`) and given its one fix; other refusals get the likely fix
        for their kind."""
        kind = type(exc).__name__
        where = f"{what} in project {self.project}, zone {self.zone} failed"
        problem = project_problem(exc, service=self.service, project=self.project, zone=self.zone)
        if problem is not None:
            error = GcpError(f"{where}: {problem.message} ({problem.reason})", hint=problem.fix)
        else:
            message = getattr(exc, "message", None) or str(exc)
            error = GcpError(f"{where}: {kind}: {message}", hint=self.hints.get(kind) or None)
        error.kind = kind  # type: ignore[attr-defined]
        error.problem = problem.kind if problem else None  # type: ignore[attr-defined]
        return error


class TpuApi(GoogleApi):
    """The API as one cluster sees it: ``name`` in ``project``/``zone``, as ``slices`` nodes (one node unless
    multislice, then ``name-0``, ``name-1``, ...), possibly behind a queued resource of the same name."""

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}"

    # -- names ---------------------------------------------------------------------------------------------
    def node_ids(self) -> list[str]:
        return self.slice_ids()

    def node_path(self, node_id: str) -> str:
        return f"{self.parent}/nodes/{node_id}"

    def queued_path(self, queued_id: str | None = None) -> str:
        """The cluster's queued resource, or another of this project and zone (``gc``'s leaks)."""
        return f"{self.parent}/queuedResources/{queued_id or self.name}"

    # -- plumbing -------------------------------------------------------------------------------------------
    def client(self) -> Any:
        if "tpu" not in self._clients:
            from google.cloud import tpu_v2

            self._clients["tpu"] = rest_client(tpu_v2.TpuClient, self.endpoint, "the Cloud TPU API")
        return self._clients["tpu"]

    @property
    def endpoint_label(self) -> str:
        return f"the Cloud TPU API at {self.endpoint or 'https://tpu.googleapis.com'}"

    def wait_operation(
        self, what: str, operation: Any, progress: Progress | None, watch: Callable[[], str] | None
    ) -> Any:
        """Poll a long-running operation, saying what it waits for, the resource's state (``watch``) and the
        time left through ``progress``, or on stderr when no one listens (tpuft.core.waiting)."""
        from google.api_core import exceptions as gexc

        with waiting(
            f"the Cloud TPU API to finish {what}", tuning.CREATE_TIMEOUT_S, progress=progress
        ) as wait:
            while not self.call(f"{what} (polling)", operation.done):
                wait.update(watch() if watch else "")
                if wait.expired():
                    raise GcpError(
                        f"{what}: still not done after {tuning.CREATE_TIMEOUT_S:.0f}s",
                        hint="See: tpuft status",
                    )
                time.sleep(tuning.POLL_SECONDS)
        try:
            return operation.result(timeout=60)
        except gexc.GoogleAPICallError as exc:
            raise self.explain(what, exc) from None


def rest_client(factory: Callable[..., T], endpoint: str | None, label: str) -> T:
    """A Google client on its REST transport, pointed at ``endpoint`` when one is set (anonymous only for a
    loopback ``http://`` one: the rigs), its requests and token refreshes held to the command's budget."""
    options: dict[str, Any] = {}
    credentials = None
    if endpoint:
        options["client_options"] = {"api_endpoint": endpoint}
        if _loopback_http(endpoint):
            from google.auth.credentials import AnonymousCredentials

            credentials = AnonymousCredentials()
    try:
        client = factory(transport="rest", credentials=credentials, **options)
    except Exception as exc:  # noqa: BLE001 - google.auth's DefaultCredentialsError and friends
        raise GcpError(
            f"cannot create the client of {label}: {exc}",
            hint="Log in with: gcloud auth application-default login",
        ) from None
    session = getattr(getattr(client, "_transport", None), "_session", None)
    if session is not None:  # the REST transport's AuthorizedSession: requests and token refreshes budgeted
        budget_session(session, label)
    return client


def _located(what: str, kwargs: dict[str, Any]) -> str:
    """``reading TPU node`` -> ``reading TPU node nodes/t5-v4``: the resource the call was about, when it
    names one."""
    target = kwargs.get("name") or getattr(kwargs.get("request"), "name", "") or ""
    if not target:
        return what
    return f"{what} {'/'.join(str(target).split('/')[-2:])}"
