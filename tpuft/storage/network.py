"""When Google Cloud cannot be reached: one time budget for a command's cloud calls, and one way to say so.

Every HTTP request the controller sends to Google (the Cloud TPU API, Cloud Storage, the OAuth2 token
endpoint) goes through a session that :func:`budget_session` has fitted with :class:`BudgetedAdapter`. The
adapter keeps the process-wide :data:`CLOCK`, an outage clock: it starts at the first request that fails for
the network's sake (refused, unresolvable, timed out, a 5xx or 429 answer) and stops at the next one that gets
an answer. While it runs, no request may wait longer than what is left of the budget (``gcp.timeout``), and
the callers' retries stop at its end (``TpuApi.call``'s loop; Storage's ``Retry`` objects get
:meth:`OutageClock.retry_deadline`). Once it is spent, each new call (:meth:`OutageClock.begin_call`) gets one
try and any further request fails at once with
:class:`CloudUnreachable`, which no library retries, not even the ones tpuft does not steer. So a command that
makes ten calls while the network is down fails within the budget, not ten times it, while a long ``train``
attach, a ``monitor`` or the recovery watcher rides out an outage: their next poll is a new call, and any
answer stops the clock.

The clock is armed only where a cluster file's ``gcp.timeout`` is read, on the controller (the CLI when it
loads the cluster file, and the TPU API client): the workers, which mirror their run dir for hours and retry
on their own, keep the libraries' own retries.

The clock is the command's budget and nothing else. What one call met (which endpoint failed, why, since when)
is that call's own :class:`CloudCall`, set by :func:`cloud_call` for the thread that makes it (the TPU API's
``TpuApi.call``, Storage's ``gcs_call``) and filled in by the adapter; the same call's wait says, after 2 s,
which service it waits for and why (:mod:`tpuft.core.waiting`), and its error names its own endpoint and time.

:func:`is_network_error` is the one classification of "the network failed" shared by the TPU API
(``providers/gcp/api``) and Cloud Storage (``storage/errors``), and :func:`unreachable` the one line it
becomes: a transport error, a DNS failure, a refused connection, a timeout or an exhausted retry, said as what
was being done, which endpoint, why, and what to check. This module is in the storage layer because Storage
needs it and may import nothing above itself.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from tpuft.core.errors import TpuftError
from tpuft.core.waiting import Wait, waiting

if TYPE_CHECKING:
    import requests

DEFAULT_TIMEOUT_S = 30.0
"""``gcp.timeout``'s default: how long one command keeps trying to reach Google Cloud before it gives up."""
LAST_TRY_S = 2.0
"""Once the budget is spent, a new call (a long-lived command's next poll) still gets one try this long, so
that the clock can stop when the network is back."""
TOKEN_ENDPOINT = "the OAuth2 token endpoint"
TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})

CHECK_HINT = (
    "Check the network and any proxy (HTTPS_PROXY), then the credentials (gcloud auth application-default "
    "login) "
    "and the cluster file's gcp.tpu_api_endpoint if set; gcp.timeout is how long tpuft keeps trying"
)


class CloudUnreachable(TpuftError):
    """Google Cloud did not answer within the budget: the input was fine, so exit code 1 (not 2)."""

    exit_code = 1

    def __init__(
        self, message: str, *, hint: str | None = CHECK_HINT, endpoint: str = "", reason: str = ""
    ) -> None:
        super().__init__(message, hint=hint)
        self.endpoint = endpoint
        self.reason = reason


class OutageClock:
    """How long the cloud has been failing, against the budget. Shared by every thread (transfers run
    many)."""

    def __init__(self) -> None:
        self.budget_s: float | None = None
        self.failing_since: float | None = None
        self._one_try = False
        self._lock = threading.Lock()

    def arm(self, seconds: float) -> None:
        """Give this process's cloud calls a budget (the controller does; workers never do)."""
        with self._lock:
            self.budget_s = float(seconds)
            self.failing_since = None  # a new cluster, a new command (in tests: the next test): no old outage

    def disarm(self) -> None:
        with self._lock:
            self.budget_s = None
            self.failing_since = None

    @property
    def armed(self) -> bool:
        return self.budget_s is not None

    def failing_for(self) -> float:
        with self._lock:
            return 0.0 if self.failing_since is None else time.monotonic() - self.failing_since

    def remaining(self) -> float | None:
        """Seconds left of the budget (the whole budget while nothing fails); None when unarmed."""
        if self.budget_s is None:
            return None
        return self.budget_s - self.failing_for()

    def spent(self) -> bool:
        left = self.remaining()
        return left is not None and left <= 0

    def failed(self, started: float) -> None:
        """A request begun at ``started`` (monotonic) got no useful answer: the outage began then at the
        latest. Which endpoint failed, and why, is the call's to know (:class:`CloudCall`), not the clock's:
        a shared name once made a storage call say that the Cloud TPU API of an earlier call did not
        answer."""
        with self._lock:
            if self.failing_since is None or started < self.failing_since:
                self.failing_since = started

    def begin_call(self) -> None:
        """A new call starts (not a library's retry of one): if the budget is spent, it may still try once."""
        with self._lock:
            self._one_try = True

    def may_send(self) -> bool:
        """Whether a request may go out now: always while budget is left, else once per call."""
        if not self.spent():
            return True
        with self._lock:
            allowed, self._one_try = self._one_try, False
            return allowed

    def answered(self) -> None:
        with self._lock:
            self.failing_since = None

    def request_timeout(self, asked: Any) -> Any:
        """The library's per-request timeout, cut to what is left of the budget (at least
        :data:`LAST_TRY_S`)."""
        left = self.remaining()
        if left is None:
            return asked
        cap = max(left, LAST_TRY_S)
        if asked is None:
            return cap
        if isinstance(asked, tuple):
            return tuple(cap if t is None else min(float(t), cap) for t in asked)
        return min(float(asked), cap)

    def retry_deadline(self) -> float | None:
        """For a google.api_core ``Retry``: the seconds its retries may take (None: the library's own)."""
        left = self.remaining()
        return None if left is None else max(left, 0.0)


CLOCK = OutageClock()


class CloudCall:
    """One call to a Google Cloud service, as the user would name it: the service (``the Cloud TPU API at
    https://tpu.googleapis.com``), what is being done (``reading TPU node nodes/t5-v4``), and what this call
    alone has met: since when its requests get no answer, from which endpoint (the service's, or the token
    endpoint's), and why. Kept per call, in a context variable (:func:`cloud_call`), never in shared state:
    the waiting line and the final error name this call's service and this call's time.

    Its wait starts with its first request (:meth:`sending`), not with the call: importing a client library
    or reading credentials is not waiting for the network."""

    def __init__(self, service: str, what: str, *, speaks: bool) -> None:
        self.service = service
        self.what = what
        self.failing_since: float | None = None
        self.endpoint = ""
        self.reason = ""
        self.wait: Wait | None = None
        self._speaks = speaks
        self._shown = ExitStack()

    def sending(self) -> None:
        """A request of this call goes out: from now on, after 2 s, the call says what it waits for."""
        if not self._speaks or self.wait is not None:
            return
        left = CLOCK.remaining()
        bound = None if left is None else max(left, LAST_TRY_S)
        self.wait = self._shown.enter_context(waiting(f"{self.service} to answer {self.what}", bound))

    def failed(self, started: float, endpoint: str, reason: str) -> None:
        if self.failing_since is None or started < self.failing_since:
            self.failing_since = started
        self.endpoint, self.reason = endpoint, reason
        if self.wait is not None:  # the token endpoint is named; the service is named by the wait already
            same = endpoint.split(" at ")[0] == self.service.split(" at ")[0]
            self.wait.update(reason if same or not endpoint else f"{reason} from {endpoint}")

    def answered(self) -> None:
        self.failing_since = None
        if self.wait is not None and self.wait.detail:
            self.wait.update("")

    def failing_for(self) -> float:
        return 0.0 if self.failing_since is None else time.monotonic() - self.failing_since

    def end(self, error: BaseException | None) -> None:
        """The call is over: its wait ends (``done: ...`` off a terminal; nothing when an error follows)."""
        self.wait = None
        if error is None:
            self._shown.close()
        else:
            self._shown.__exit__(type(error), error, error.__traceback__)


_CALL: ContextVar[CloudCall | None] = ContextVar("tpuft_cloud_call", default=None)
_QUIET: ContextVar[bool] = ContextVar("tpuft_cloud_calls_quiet", default=False)


@contextmanager
def quiet_calls() -> Iterator[None]:
    """The cloud calls made inside say nothing while they wait: for a caller that shows the outcome its own
    way and does not wait it out (``monitor``'s node state, asked in a thread it abandons after a few
    seconds: a wait line of that thread would be drawn over the live view, and outlive the refresh)."""
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)


@contextmanager
def cloud_call(service: str, what: str, *, wait: bool = True) -> Iterator[CloudCall]:
    """One call to ``service`` (every retry of it included): a new call for the budget
    (:meth:`OutageClock.begin_call`), and, on the controller (where the budget is armed), a wait that says
    2 s (``SILENT_S``) after its first request what it waits for, like tpuft's other waits
    (:mod:`tpuft.core.waiting`): ``waiting for Cloud Storage at https://storage.googleapis.com to answer list
    runs gs://b/runs/: connection refused (26 s left)``. The workers, which never arm the budget, stay
    quiet: their run-dir mirror is not a wait anyone watches. ``wait=False`` for a transfer, which moves
    bytes for as long as they take (``pull`` shows its own progress)."""
    CLOCK.begin_call()
    call = CloudCall(service, what, speaks=wait and CLOCK.armed and not _QUIET.get())
    token = _CALL.set(call)
    try:
        yield call
    except BaseException as error:
        call.end(error)
        raise
    else:
        call.end(None)
    finally:
        _CALL.reset(token)


def current_call() -> CloudCall | None:
    """The call this thread is making, if any (a library's worker threads make none)."""
    return _CALL.get()


_ADAPTER: type | None = None


def _adapter_class() -> type:
    """Built on first use: ``requests`` is imported only by the commands that talk to the cloud."""
    global _ADAPTER
    if _ADAPTER is None:
        from requests.adapters import HTTPAdapter

        class BudgetedAdapter(HTTPAdapter):
            """An HTTP adapter that keeps :data:`CLOCK`: capped timeouts, failures timed, no request past the
            budget."""

            def __init__(self, role: str, **kwargs: Any) -> None:
                self.role = role
                super().__init__(**kwargs)

            def send(  # type: ignore[override]
                self, request: requests.PreparedRequest, *args: Any, **kwargs: Any
            ) -> requests.Response:
                endpoint = endpoint_label(self.role, request.url or "")
                call = current_call()
                if not CLOCK.may_send():
                    raise _spent(call, endpoint)
                if call is not None:
                    call.sending()
                kwargs["timeout"] = CLOCK.request_timeout(kwargs.get("timeout"))
                started = time.monotonic()
                try:
                    response = super().send(request, *args, **kwargs)
                except OSError as exc:  # requests' ConnectionError and Timeout are OSErrors too
                    CLOCK.failed(started)
                    if call is not None:
                        call.failed(started, endpoint, reason_of(exc))
                    raise
                if response.status_code in TRANSIENT_STATUS:
                    CLOCK.failed(started)
                    if call is not None:
                        call.failed(started, endpoint, f"HTTP {response.status_code}")
                else:
                    CLOCK.answered()
                    if call is not None:
                        call.answered()
                return response

        _ADAPTER = BudgetedAdapter
    return _ADAPTER


def _spent(call: CloudCall | None, endpoint: str) -> CloudUnreachable:
    """The budget is spent and this call has had its one try: what this call met (else this request's
    endpoint), never what another call met."""
    if call is not None and call.endpoint:
        seconds = call.failing_for()
        waited = f" for {seconds:.0f}s" if seconds >= 1 else ""
        return CloudUnreachable(
            f"no answer from {call.endpoint}{waited} ({call.reason})",
            endpoint=call.endpoint,
            reason=call.reason,
        )
    return CloudUnreachable(
        f"no answer from {endpoint} (gcp.timeout spent)", endpoint=endpoint, reason="gcp.timeout spent"
    )


def budget_session(session: Any, role: str, *, pool_maxsize: int = 10) -> Any:
    """Fit a requests session (and, for google-auth's ``AuthorizedSession``, the session its token refreshes
    use) with the budgeted adapter. A mutual-TLS adapter, if one is configured, is left alone."""
    from requests.adapters import HTTPAdapter

    adapter = _adapter_class()

    def fit(target: Any, role: str, **settings: Any) -> None:
        for scheme in ("https://", "http://"):
            if type(target.adapters.get(scheme)) in (HTTPAdapter, adapter):
                target.mount(scheme, adapter(role, **settings))

    fit(session, role, pool_maxsize=pool_maxsize)
    token_session = getattr(getattr(session, "_auth_request", None), "session", None)
    if token_session is not None and token_session is not session:
        fit(token_session, TOKEN_ENDPOINT)
    return session


def endpoint_label(role: str, url: str) -> str:
    """``Cloud Storage at http://127.0.0.1:9/`` - the service and where it was asked."""
    parts = urlsplit(url)
    where = f"{parts.scheme}://{parts.netloc}" if parts.netloc else url
    if role == TOKEN_ENDPOINT:
        where += parts.path
    return f"{role} at {where}"


def reason_of(exc: BaseException) -> str:
    """The network's own words for a failure, short: ``connection refused``, ``name not resolved``, ``timed
    out``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    words = ""
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = type(current).__name__
        if isinstance(current, ConnectionRefusedError):
            return "connection refused"
        if isinstance(current, socket.gaierror) or "NameResolution" in name:
            return "name not resolved"
        if isinstance(current, TimeoutError | socket.timeout) or "Timeout" in name:
            words = words or "timed out"
        if "SSL" in name:
            words = words or "TLS handshake failed"
        if isinstance(current, CloudUnreachable) and current.reason:
            return current.reason
        current = current.__cause__ or current.__context__ or _wrapped(current)
    if words:
        return words
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."


def _wrapped(exc: BaseException) -> BaseException | None:
    """What a library kept inside its own exception: a RetryError's ``cause``, urllib3's ``reason``, an
    args[0]."""
    for attribute in ("cause", "reason", "last_exc"):
        inner = getattr(exc, attribute, None)
        if isinstance(inner, BaseException):
            return inner
    args = getattr(exc, "args", ())
    if args and isinstance(args[0], BaseException):
        return args[0]
    return None


def is_network_error(exc: BaseException) -> bool:
    """True for a failure of the way to the cloud, not of the request: transport and token-endpoint failures,
    DNS, refused or dropped connections, timeouts, 503/504 and retries that ran out on any of these."""
    import requests
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as auth_exc

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(
            current, CloudUnreachable | auth_exc.TransportError | requests.ConnectionError | requests.Timeout
        ):
            return True
        if isinstance(current, gexc.ServiceUnavailable | gexc.DeadlineExceeded | gexc.GatewayTimeout):
            return True
        if isinstance(current, auth_exc.RefreshError) and _refresh_failed_on_the_way(current):
            return True
        if isinstance(current, gexc.RetryError):
            current = current.cause
            continue
        if isinstance(current, ConnectionError | TimeoutError | socket.gaierror | socket.herror):
            return True
        current = current.__cause__ or current.__context__
    return False


def _refresh_failed_on_the_way(exc: BaseException) -> bool:
    """A RefreshError is the network's when the token endpoint never answered (retries of 5xx, a timeout)."""
    text = str(exc).lower()
    return any(word in text for word in ("timed out", "timeout", "unavailable", "connection", "503", "504"))


def unreachable(what: str, exc: BaseException, *, endpoint: str = "") -> CloudUnreachable:
    """The one line for a network failure: ``what`` was being done, which ``endpoint`` (the failing one as the
    clock saw it, else the service's), the reason and for how long."""
    inner = exc if isinstance(exc, CloudUnreachable) else None
    call = current_call()
    where = (inner.endpoint if inner else "") or (call.endpoint if call else "") or endpoint
    reason = (inner.reason if inner else "") or reason_of(exc)
    seconds = call.failing_for() if call is not None else 0.0
    waited = f" for {seconds:.0f}s" if seconds >= 1 else ""
    return CloudUnreachable(
        f"{what}: no answer from {where or 'Google Cloud'}{waited} ({reason})", endpoint=where, reason=reason
    )
