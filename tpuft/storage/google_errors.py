"""Google Cloud's answers that say a project is not ready yet, each as what is wrong and the one fix.

A first project meets five refusals before anything else: the API is not enabled (``SERVICE_DISABLED``), the
account lacks a permission (``IAM_PERMISSION_DENIED``), a quota is spent (``RATE_LIMIT_EXCEEDED``,
``RESOURCE_QUOTA_EXCEEDED``, the JSON API's ``quotaExceeded``), billing is off (``BILLING_DISABLED``,
``accountDisabled``) or an organization policy forbids the request (a ``constraints/...`` violation). Google
says which in the error's own fields: the ``google.rpc.ErrorInfo`` detail (``reason``, ``domain``,
``metadata``: google-api-core's ``exc.reason``, ``exc.domain``, ``exc.metadata``), the other details
(``QuotaFailure``, ``PreconditionFailure``: ``exc.details``) and, from the Cloud Storage JSON API, the legacy
``errors[].reason`` (``exc.errors``). :func:`project_problem` reads those first and the message text only when
they say nothing, because the same HTTP 403 means "enable the API", "grant a role" or "link billing" and only
the reason tells them apart (a 403 for a disabled API used to be answered "your account needs
roles/tpu.admin").

The Cloud TPU API (``providers/gcp/api``) and Cloud Storage (``storage/errors``) both call it, and put its
``message`` in their located line (the call, the project and zone, or the bucket) and its ``fix`` in the hint.
What a project needs first is listed in docs/gcp.md ("Before the first command"). In the storage layer, beside
:mod:`tpuft.storage.network`, because Storage needs it and may import nothing above itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

QUOTAS_PAGE = "https://console.cloud.google.com/iam-admin/quotas?project={project}"
PREREQUISITES = "what a project needs first: docs/gcp.md"
ASK_ACCOUNT = '"user:$(gcloud config get-value account)"'
"""The member of an IAM binding: the account gcloud uses (a service account is ``serviceAccount:EMAIL``)."""
DEFAULT_PROJECT = "$(gcloud config get-value project)"
"""The project in a command when the call does not know its own: the one gcloud (and so ADC) uses."""

SERVICE_NAMES = {
    "tpu.googleapis.com": "the Cloud TPU API",
    "storage.googleapis.com": "the Cloud Storage API",
    "storage-api.googleapis.com": "the Cloud Storage JSON API",
    "compute.googleapis.com": "the Compute Engine API",
}
ROLE_FOR_PERMISSION = {"tpu.": "roles/tpu.admin", "storage.buckets.": "roles/storage.admin"}
"""The predefined role that holds a denied permission (else ``roles/storage.objectAdmin`` for objects)."""
POLICY_FIXES = {
    "constraints/gcp.resourceLocations": "choose a zone (and a bucket location) the policy allows",
    "constraints/compute.vmExternalIpAccess": "set gcp.internal_ip: true (no external IPs)",
    "constraints/compute.requireOsLogin": "set ssh.os_login: true",
    "constraints/compute.vmCanIpForward": "ask an organization admin for an exception",
}
"""Organization policies a TPU VM or a bucket can trip, and what the cluster file can do about them."""

QUOTA_REASONS = frozenset(
    {"RATE_LIMIT_EXCEEDED", "RESOURCE_QUOTA_EXCEEDED", "quotaExceeded", "rateLimitExceeded"}
) | frozenset({"userRateLimitExceeded", "dailyLimitExceeded"})
RATE_REASONS = frozenset({"RATE_LIMIT_EXCEEDED", "rateLimitExceeded", "userRateLimitExceeded"})
BILLING_REASONS = frozenset({"BILLING_DISABLED", "accountDisabled", "billingNotEnabled"})
DISABLED_REASONS = frozenset({"SERVICE_DISABLED", "accessNotConfigured"})
DENIED_REASONS = frozenset({"IAM_PERMISSION_DENIED", "forbidden", "insufficientPermissions"})
POLICY_REASONS = frozenset({"orgPolicyConstraintFailed", "ORG_POLICY_CONSTRAINT_VIOLATED"})

_CONSTRAINT = re.compile(r"constraints/[A-Za-z0-9_.]+")
_QUOTA_NAME = re.compile(r"[Qq]uota (?:limit |metric )?'([^']+)'")
_PER_TIME = re.compile(r"\bper (?:second|minute|\d+ seconds|day)\b|per-minute|per-second", re.IGNORECASE)
_PERMISSION = re.compile(r"[Pp]ermission '([a-z]+\.[A-Za-z.]+)'|(?:does not have|lacks) ([a-z]+\.[A-Za-z.]+)")


@dataclass(frozen=True)
class ProjectProblem:
    """What the project lacks (``kind``), said for the user (``message``), and the one fix (``fix``)."""

    kind: str
    """``api disabled``, ``permission denied``, ``quota exceeded``, ``billing disabled`` or ``org policy``."""
    reason: str
    """Google's own word for it (``SERVICE_DISABLED``, ``quotaExceeded``, ...), or ``message`` when only the
    text said so."""
    message: str
    fix: str
    lasting: bool = True
    """Whether asking again cannot help: all of them but a rate limit (a quota per minute), which a caller's
    back-off rides out. A spent allocation quota (chips in a zone) answers 429 too, and was retried for the
    whole ``gcp.timeout`` before it was said."""


@dataclass(frozen=True)
class _Said:
    """What one error says about itself, gathered from wherever google-api-core put it."""

    reasons: tuple[str, ...]
    metadata: Mapping[str, str]
    details: tuple[Mapping[str, Any], ...]
    text: str


def project_problem(
    exc: BaseException, *, service: str, project: str | None = None, zone: str | None = None
) -> ProjectProblem | None:
    """The project's problem that ``exc`` reports, or None when it is another kind of failure.

    ``service`` is the API that was called (``tpu.googleapis.com``); ``project`` and ``zone`` are the
    caller's (the cluster file's), used in the fix when Google's metadata does not name them."""
    said = _said(exc)
    named = said.metadata.get("service") or service
    where = project or _project_of(said.metadata.get("consumer", "")) or DEFAULT_PROJECT
    for kind, judge in _JUDGES:
        if judge(said):
            return _PHRASES[kind](said, named, where, zone)
    return None


def _said(exc: BaseException) -> _Said:
    reasons: list[str] = []
    metadata: dict[str, str] = {}
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str) and reason:
        reasons.append(reason)
    found = getattr(exc, "metadata", None)
    if isinstance(found, Mapping):
        metadata.update({str(k): str(v) for k, v in found.items()})
    details = tuple(_as_dicts(getattr(exc, "details", None) or ()))
    for detail in details:
        if str(detail.get("@type", "")).endswith("google.rpc.ErrorInfo"):
            reasons.append(str(detail.get("reason", "")))
            metadata.update({str(k): str(v) for k, v in (detail.get("metadata") or {}).items()})
    for legacy in getattr(exc, "errors", None) or ():  # the JSON API's [{"reason": "...", "domain": ...}]
        if isinstance(legacy, Mapping) and legacy.get("reason"):
            reasons.append(str(legacy["reason"]))
    text = str(getattr(exc, "message", None) or exc)
    return _Said(tuple(r for r in reasons if r), metadata, details, text)


def _as_dicts(details: Iterable[Any]) -> Iterable[Mapping[str, Any]]:
    """REST details are dicts already; a gRPC transport's are protobuf messages (turned into dicts)."""
    for detail in details:
        if isinstance(detail, Mapping):
            yield detail
            continue
        try:
            from google.protobuf.json_format import MessageToDict

            converted = MessageToDict(detail)
            converted.setdefault("@type", type(detail).DESCRIPTOR.full_name)
            yield converted
        except Exception:  # noqa: BLE001 - a detail of a shape we cannot read is skipped, not fatal
            continue


def _project_of(consumer: str) -> str:
    """``projects/123456`` -> ``123456`` (gcloud takes a project number wherever it takes an id)."""
    return consumer.removeprefix("projects/") if consumer.startswith("projects/") else ""


def _has(said: _Said, reasons: frozenset[str]) -> bool:
    return any(r in reasons for r in said.reasons)


def _constraint(said: _Said) -> str:
    for detail in said.details:
        for violation in detail.get("violations") or ():
            kind = str(violation.get("type", "")) if isinstance(violation, Mapping) else ""
            if kind.startswith("constraints/"):
                return kind
    found = _CONSTRAINT.search(said.text)
    return found.group(0) if found else ""


def _is_disabled(said: _Said) -> bool:
    if _has(said, DISABLED_REASONS):
        return True
    return not said.reasons and "has not been used in project" in said.text and "disabled" in said.text


def _is_billing(said: _Said) -> bool:
    if _has(said, BILLING_REASONS):
        return True
    text = said.text.lower()
    billing_off = "disabled" in text or "not enabled" in text or "requires billing" in text
    return not said.reasons and "billing" in text and billing_off


def _is_policy(said: _Said) -> bool:
    return _has(said, POLICY_REASONS) or bool(_constraint(said))


def _is_quota(said: _Said) -> bool:
    if _has(said, QUOTA_REASONS):
        return True
    if any(str(d.get("@type", "")).endswith("google.rpc.QuotaFailure") for d in said.details):
        return True
    text = said.text.lower()
    return "quota" in text and ("exceeded" in text or "exhausted" in text)


def _is_denied(said: _Said) -> bool:
    if _has(said, DENIED_REASONS):
        return True
    return not said.reasons and bool(_PERMISSION.search(said.text)) and "denied" in said.text.lower()


# the order matters where a text names two things ("billing ... disabled" in a 403 that is not about IAM)
_JUDGES = (
    ("api disabled", _is_disabled),
    ("billing disabled", _is_billing),
    ("org policy", _is_policy),
    ("quota exceeded", _is_quota),
    ("permission denied", _is_denied),
)


def _reason(said: _Said, known: frozenset[str]) -> str:
    return next((r for r in said.reasons if r in known), "message")


def _disabled(said: _Said, service: str, project: str, zone: str | None) -> ProjectProblem:
    name = SERVICE_NAMES.get(service, service)
    return ProjectProblem(
        "api disabled",
        _reason(said, DISABLED_REASONS),
        f"{name} ({service}) is not enabled in project {project}",
        f"Enable it: gcloud services enable {service} --project {project} (it takes a minute to apply); "
        f"{PREREQUISITES}",
    )


def _billing(said: _Said, service: str, project: str, zone: str | None) -> ProjectProblem:
    return ProjectProblem(
        "billing disabled",
        _reason(said, BILLING_REASONS),
        f"billing is not enabled for project {project}",
        f"Link a billing account: gcloud billing projects link {project} --billing-account ACCOUNT_ID "
        f"(the IDs: gcloud billing accounts list); {PREREQUISITES}",
    )


def _policy(said: _Said, service: str, project: str, zone: str | None) -> ProjectProblem:
    constraint = _constraint(said) or "an organization policy constraint"
    own_fix = POLICY_FIXES.get(constraint)
    describe = (
        f"gcloud resource-manager org-policies describe {constraint} --project {project} --effective"
        if constraint.startswith("constraints/")
        else "gcloud resource-manager org-policies list --project " + project
    )
    fix = f"{own_fix[0].upper()}{own_fix[1:]}, or ask" if own_fix else "Ask"
    return ProjectProblem(
        "org policy",
        _reason(said, POLICY_REASONS) if said.reasons else "message",
        f"the organization policy {constraint} forbids this request in project {project}",
        f"{fix} an organization admin to allow it; the policy: {describe}",
    )


def _quota(said: _Said, service: str, project: str, zone: str | None) -> ProjectProblem:
    metric = said.metadata.get("quota_metric") or said.metadata.get("quota_limit")
    if not metric:
        found = _QUOTA_NAME.search(said.text)
        metric = found.group(1) if found else ""
    for detail in said.details:
        for violation in detail.get("violations") or ():
            if not metric and isinstance(violation, Mapping):
                metric = str(violation.get("subject", "") or "")
    named = f"the quota {metric}" if metric else "a quota"
    location = said.metadata.get("quota_location") or zone
    place = f" in {location}" if location else ""
    filter_by = metric or SERVICE_NAMES.get(service, service)
    rate = _has(said, RATE_REASONS) or (not said.reasons and bool(_PER_TIME.search(said.text)))
    return ProjectProblem(
        "quota exceeded",
        _reason(said, QUOTA_REASONS),
        f"{named} of project {project}{place} is exceeded",
        f"Ask for more at {QUOTAS_PAGE.format(project=project)} (filter: {filter_by}), "
        "or try another zone, spot, or gcp.queued: true",
        lasting=not rate,
    )


def _denied(said: _Said, service: str, project: str, zone: str | None) -> ProjectProblem:
    permission = said.metadata.get("permission", "")
    if not permission:
        found = _PERMISSION.search(said.text)
        permission = (found.group(1) or found.group(2)) if found else ""
    role = next(
        (role for prefix, role in ROLE_FOR_PERMISSION.items() if permission.startswith(prefix)),
        "roles/tpu.admin" if service.startswith("tpu.") else "roles/storage.objectAdmin",
    )
    missing = f"the permission {permission}" if permission else f"a permission of {role}"
    resource = said.metadata.get("resource", "")
    on = f" on {resource}" if resource else ""
    return ProjectProblem(
        "permission denied",
        _reason(said, DENIED_REASONS),
        f"permission denied: the account in use lacks {missing}{on} (project {project})",
        f"Grant it {role}: gcloud projects add-iam-policy-binding {project} --member={ASK_ACCOUNT} "
        f"--role={role} (or log in as an account that has it: gcloud auth application-default login)",
    )


_PHRASES = {
    "api disabled": _disabled,
    "billing disabled": _billing,
    "org policy": _policy,
    "quota exceeded": _quota,
    "permission denied": _denied,
}
