"""Google Cloud Storage failures as one line a user can act on: which call, which object, what to do.

Every GCS call runs inside :func:`gcs_call`, which turns the client's exceptions (HTTP errors, auth errors,
corrupted downloads, dropped connections) into :class:`~tpuft.core.errors.TpuftError` with a hint; what the
project lacks (the API enabled, a role, quota, billing, an organization policy) is read from the error's
reason fields by :mod:`tpuft.storage.google_errors`, the same reading as the TPU API's. A network
that does not answer (Storage or the token endpoint: refused, unresolvable, timed out, retries run out) is
told apart by
:mod:`tpuft.storage.network`, the classification the TPU API shares, and becomes its one line.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tpuft.core.errors import TpuftError
from tpuft.storage.google_errors import project_problem
from tpuft.storage.network import CloudUnreachable, cloud_call, endpoint_label, is_network_error, unreachable

LOGIN_HINT = "Run: gcloud auth application-default login (on a VM, check its service account and scopes)"


@contextmanager
def gcs_call(call: str, target: str, *, project: str | None = None, wait: bool = True) -> Iterator[None]:
    """Turn what google-cloud-storage raises into a :class:`TpuftError` that names the object and the call
    (and ``project``, the bucket's, when the caller knows it). The call says what it waits for after 2 s
    (:func:`~tpuft.storage.network.cloud_call`); ``wait=False`` for a transfer, which reports its own
    progress."""
    with cloud_call(storage_endpoint(), f"{call} {target}", wait=wait):
        try:
            yield
        except CloudUnreachable as exc:  # the budget ran out inside the library: say which call it ended
            raise unreachable(f"{call} {target}", exc, endpoint=storage_endpoint()) from None
        except TpuftError:
            raise
        except Exception as exc:
            raise as_tpuft(exc, call, target, project=project) from exc


STORAGE_ENDPOINT = "Cloud Storage"
STORAGE_SERVICE = "storage.googleapis.com"


def storage_endpoint() -> str:
    """``Cloud Storage at https://storage.googleapis.com``: where google-cloud-storage sends its requests
    (``$STORAGE_EMULATOR_HOST``, else ``$API_ENDPOINT_OVERRIDE``, else Google's), read as the call starts."""
    where = (
        os.environ.get("STORAGE_EMULATOR_HOST")
        or os.environ.get("API_ENDPOINT_OVERRIDE")
        or "https://storage.googleapis.com"
    )
    return endpoint_label(STORAGE_ENDPOINT, where if "://" in where else f"http://{where}")


def as_tpuft(exc: BaseException, call: str, target: str, *, project: str | None = None) -> TpuftError:
    if is_network_error(exc):
        return unreachable(f"{call} {target}", exc, endpoint=storage_endpoint())
    bucket = "gs://" + target.removeprefix("gs://").split("/", 1)[0]
    problem = project_problem(exc, service=STORAGE_SERVICE, project=project) if _is_api_error(exc) else None
    if problem is not None:
        hint = problem.fix
        if problem.kind == "permission denied":
            hint += f". Bucket names are global: if another project owns {bucket}, choose another name"
        return TpuftError(f"{target}: {call}: {problem.message} ({problem.reason})", hint=hint)
    for kind, explain in _EXPLAINERS:
        if kind(exc):
            message, hint = explain(exc, bucket)
            return TpuftError(f"{target}: {call}: {message}", hint=hint)
    return TpuftError(f"{target}: {call} failed: {type(exc).__name__}: {exc}")


def _api_error(code: int) -> Callable[[BaseException], bool]:
    def check(exc: BaseException) -> bool:
        from google.api_core.exceptions import GoogleAPICallError

        return isinstance(exc, GoogleAPICallError) and exc.code == code

    return check


def _message(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return str(text).strip().splitlines()[0] if str(text).strip() else type(exc).__name__


def _is_auth_error(exc: BaseException) -> bool:
    from google.auth.exceptions import DefaultCredentialsError, RefreshError

    return isinstance(exc, RefreshError | DefaultCredentialsError) or _api_error(401)(exc)


def _is_corruption(exc: BaseException) -> bool:
    try:
        from google.cloud.storage.exceptions import DataCorruption
    except ImportError:  # google-cloud-storage 2.x (worker venvs may have it): google-resumable-media's
        from google.resumable_media import DataCorruption
    return isinstance(exc, DataCorruption)


def _is_bad_response(exc: BaseException) -> bool:
    try:
        from google.cloud.storage.exceptions import InvalidResponse
    except ImportError:  # google-cloud-storage 2.x
        from google.resumable_media import InvalidResponse
    return isinstance(exc, InvalidResponse)


def _is_connection_error(exc: BaseException) -> bool:
    import requests

    return isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout)


def _is_api_error(exc: BaseException) -> bool:
    from google.api_core.exceptions import GoogleAPICallError

    return isinstance(exc, GoogleAPICallError)


def _status_of(exc: BaseException) -> str:
    response: Any = getattr(exc, "response", None)
    return f"HTTP {getattr(response, 'status_code', '?')}"


_EXPLAINERS: list[
    tuple[Callable[[BaseException], bool], Callable[[BaseException, str], tuple[str, str | None]]]
] = [
    (
        _api_error(404),
        lambda e, b: (
            f"not found ({_message(e)})",
            f"Check the cluster's bucket setting; `tpuft up` creates {b} when it is missing",
        ),
    ),
    (
        _api_error(403),
        lambda e, b: (
            f"permission denied ({_message(e)})",
            (
                f"The account in use needs roles/storage.objectAdmin on {b} (roles/storage.admin to "
                "create it). Bucket names are global: if another project owns this one, choose another name"
            ),
        ),
    ),
    (_is_auth_error, lambda e, b: (f"credentials were refused or have expired ({_message(e)})", LOGIN_HINT)),
    (
        _api_error(409),
        lambda e, b: (
            f"conflict ({_message(e)})",
            "Bucket names are global: another project may own this one",
        ),
    ),
    (
        _api_error(429),
        lambda e, b: (f"rate limited ({_message(e)})", "Use fewer workers, or retry in a minute"),
    ),
    (
        _is_corruption,
        lambda e, b: (
            "checksum mismatch, the copy was discarded",
            "Run it again; a repeated mismatch is a bug",
        ),
    ),
    (_is_bad_response, lambda e, b: (f"unexpected answer {_status_of(e)} ({_message(e)})", None)),
    (
        _is_connection_error,
        lambda e, b: (
            f"cannot reach Cloud Storage ({type(e).__name__})",
            "Check the network (and a proxy, if any)",
        ),
    ),
    (_is_api_error, lambda e, b: (f"failed: {_message(e)}", None)),
]
