"""What the outside world accepts as a name: GCP (zones, projects, buckets, labels, ...), POSIX (environment
variables, user names) and pip (versions, requirements).

Checked when a config file is loaded, so a malformed value is refused at its file:line before anything runs,
instead of failing minutes later in a cloud call or on the workers, and so that no value can change the
meaning of a command line on a worker. Each check returns None when the value is fine, else the reason,
phrased for the user. The formats follow Google's and POSIX's documentation; the region list is a catalogue
(see ``GCP_REGIONS``).

Framework-free and imported on the worker too (through ``tpuft.config``).
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
from urllib.parse import urlsplit

# -----------------------------------------------------------------------------------------------------------
# POSIX

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV = ("HOME", "PYTHONPATH")
"""Set by tpuft on every worker process (with the ``TPUFT_*`` ones): a cluster file may not replace them."""
USER_TPUFT_ENV = ("TPUFT_EVENTS", "TPUFT_GOODPUT_EXTERNAL")
"""The ``TPUFT_*`` switches meant for the user (docs/operations.md, Goodput): recording the run's events off,
and the job's own ml-goodput-measurement named."""
MAX_ENV_VALUE = 32 * 1024


def env_name_problem(name: str) -> str | None:
    if not ENV_NAME.fullmatch(name):
        return (
            f"{name!r} is not an environment variable name: use letters, digits and '_', not starting with "
            "a digit (e.g. XLA_FLAGS)"
        )
    if (name.startswith("TPUFT_") and name not in USER_TPUFT_ENV) or name in RESERVED_ENV:
        return f"{name} is set by tpuft on every worker; it cannot be set here"
    return None


def env_value_problem(value: str) -> str | None:
    if "\x00" in value:
        return "contains a NUL character, which no environment variable can hold"
    if len(value) > MAX_ENV_VALUE:
        return f"is {len(value):,} characters; the limit is {MAX_ENV_VALUE:,} (it travels on a command line)"
    return None


USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")


def user_name_problem(name: str) -> str | None:
    if USER_NAME.fullmatch(name):
        return None
    return (
        f"{name!r} is not a login name: 1-32 letters, digits, '_', '.' or '-', starting with a letter or '_'"
    )


_COMMAND = re.compile(r"[A-Za-z0-9_./+~][A-Za-z0-9_./+~-]*")


def command_problem(text: str) -> str | None:
    """An interpreter given by name or path (``python3``, ``/usr/bin/python3.11``)."""
    if _COMMAND.fullmatch(text):
        return None
    return f"{text!r} is not a command name or path (letters, digits and _ . / + ~ -, not starting with '-')"


def path_text_problem(text: str) -> str | None:
    """A path that travels to a worker: printable, and not an option."""
    if not text:
        return "is empty"
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        return "contains a control character (newline, NUL, ...)"
    if text.startswith("-"):
        return "starts with '-' (it would be read as an option)"
    if len(text) > 4096:
        return "is longer than 4096 characters"
    return None


_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})?")


def model_ref_problem(text: str) -> str | None:
    """A Hugging Face hub id (``google/t5-v1_1-small``) or a path (one with a ``/``, or starting with ``.`` or
    ``~``); paths are not checked for existence here: on a pod they are the workers' paths."""
    if _HUB_ID.fullmatch(text) and ".." not in text:
        return None
    if ("/" in text or text.startswith((".", "~"))) and not path_text_problem(text):
        return None
    return f"{text!r} is neither a Hugging Face model id (org/name) nor a path"


# ----------------------------------------------------------------------------------------------------------
# pip


_VERSION = re.compile(
    r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[a-z0-9]+(\.[a-z0-9]+)*)?", re.IGNORECASE
)


def version_problem(text: str) -> str | None:
    """A release number as pip pins it (PEP 440): ``2.9.0``, ``2.9.0rc1``, ``2.9.0+cpu``."""
    if _VERSION.fullmatch(text):
        return None
    return f"{text!r} is not a version number like 2.9.0 (PEP 440)"


def requirement_problem(text: str) -> str | None:
    """One pip requirement (PEP 508), e.g. ``datasets>=3,<4`` or ``t5x @ git+https://...``; never a pip
    option."""
    if not text.strip():
        return "is empty"
    if text.lstrip().startswith("-"):
        return f"{text!r} is a pip option, not a requirement (options such as --index-url cannot be set here)"
    if any(ord(c) < 32 for c in text):
        return f"{text!r} contains a control character"
    try:
        from packaging.requirements import InvalidRequirement, Requirement
    except ImportError:  # a worker venv without packaging: the controller has checked it already
        return None
    try:
        Requirement(text)
    except InvalidRequirement as exc:
        reason = str(exc).splitlines()[0]
        return f"{text!r} is not a pip requirement (PEP 508): {reason}"
    return None


# ----------------------------------------------------------------------------------------------------------
# Google Cloud

GCP_REGIONS = (
    "africa-south1",
    "asia-east1",
    "asia-east2",
    "asia-northeast1",
    "asia-northeast2",
    "asia-northeast3",
    "asia-south1",
    "asia-south2",
    "asia-southeast1",
    "asia-southeast2",
    "australia-southeast1",
    "australia-southeast2",
    "europe-central2",
    "europe-north1",
    "europe-north2",
    "europe-southwest1",
    "europe-west1",
    "europe-west2",
    "europe-west3",
    "europe-west4",
    "europe-west6",
    "europe-west8",
    "europe-west9",
    "europe-west10",
    "europe-west12",
    "me-central1",
    "me-central2",
    "me-west1",
    "northamerica-northeast1",
    "northamerica-northeast2",
    "northamerica-south1",
    "southamerica-east1",
    "southamerica-west1",
    "us-central1",
    "us-central2",
    "us-east1",
    "us-east4",
    "us-east5",
    "us-south1",
    "us-west1",
    "us-west2",
    "us-west3",
    "us-west4",
)
"""Google Cloud regions (cloud.google.com/compute/docs/regions-zones, 2026). A region opened since then is
accepted with ``TPUFT_ALLOW_UNKNOWN_REGION=1``."""
_ZONE = re.compile(r"([a-z]+-[a-z]+[0-9]+)-([a-z])")


def zone_problem(zone: str) -> str | None:
    match = _ZONE.fullmatch(zone)
    if not match:
        close = difflib.get_close_matches(
            zone.lower().replace(" ", "-"), [f"{r}-a" for r in GCP_REGIONS], n=1
        )
        hint = f"; did you mean {close[0][:-2]}-<a|b|c>?" if close else ""
        return f"{zone!r} is not a zone: expected REGION-LETTER like us-central2-b{hint}"
    region, letter = match.groups()
    if region not in GCP_REGIONS and not os.environ.get("TPUFT_ALLOW_UNKNOWN_REGION"):
        close = difflib.get_close_matches(region, GCP_REGIONS, n=1, cutoff=0.7)
        hint = f"did you mean {close[0]}-{letter}? " if close else ""
        return (
            f"{zone!r}: {region} is not a Google Cloud region ({hint}a new region: set "
            "TPUFT_ALLOW_UNKNOWN_REGION=1)"
        )
    if letter not in "abcdef":
        return f"{zone!r}: zones end in a letter from a to f (e.g. {region}-a, {region}-b)"
    return None


_PROJECT = re.compile(r"(?:[a-z0-9][a-z0-9.-]*[a-z0-9]:)?[a-z][a-z0-9-]{4,28}[a-z0-9]")


def project_problem(project: str) -> str | None:
    if _PROJECT.fullmatch(project):
        return None
    return (
        f"{project!r} is not a project id: 6-30 lowercase letters, digits or dashes, starting with a "
        "letter and not ending with a dash (the id, not the display name: gcloud projects list)"
    )


def bucket_problem(url: str) -> str | None:
    """``gs://NAME[/prefix]`` with a name Cloud Storage accepts."""
    if not url.startswith("gs://"):
        return f"{url!r}: expected gs://BUCKET or gs://BUCKET/prefix"
    name, _, prefix = url[len("gs://") :].partition("/")
    problem = bucket_name_problem(name)
    if problem:
        return problem
    prefix = prefix.rstrip("/")
    if prefix:
        parts = prefix.split("/")
        if any(part in {"", ".", ".."} for part in parts):
            return f"{url!r}: the prefix has an empty, '.' or '..' part"
        if (
            any(ord(c) < 32 or ord(c) == 127 for c in prefix)
            or "#" in prefix
            or "[" in prefix
            or "*" in prefix
        ):
            return f"{url!r}: the prefix has a control character or one of # [ *"
    return None


def bucket_name_problem(name: str) -> str | None:
    rule = "3-63 lowercase letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*[a-z0-9]", name) or len(name) < 3:
        return f"bucket name {name!r} is not valid: {rule}"
    if (
        len(name) > 222
        or any(len(part) > 63 for part in name.split("."))
        or ("." not in name and len(name) > 63)
    ):
        return f"bucket name {name!r} is too long: {rule} (up to 222 with dots, 63 between dots)"
    if ".." in name or name.startswith("goog") or "google" in name:
        return (
            f"bucket name {name!r} is not allowed by Cloud Storage ('..', a 'goog' prefix or 'google' in it)"
        )
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return None
    return f"bucket name {name!r} looks like an IP address, which Cloud Storage refuses"


def _label_chars_ok(text: str) -> bool:
    return all(c.isdigit() or c in "_-" or (c.isalpha() and c == c.lower()) for c in text)


def label_problem(key: str, value: str) -> str | None:
    if not (1 <= len(key) <= 63) or not key[0].isalpha() or not _label_chars_ok(key):
        return (
            f"label key {key!r}: 1-63 lowercase letters, digits, '_' or '-', starting with a lowercase letter"
        )
    if len(value) > 63 or not _label_chars_ok(value):
        return f"label {key}: value {value!r}: at most 63 lowercase letters, digits, '_' or '-'"
    return None


_METADATA_KEY = re.compile(r"[A-Za-z0-9_-]{1,128}")


def metadata_problem(key: str, value: str) -> str | None:
    if not _METADATA_KEY.fullmatch(key):
        return f"metadata key {key!r}: 1-128 letters, digits, '_' or '-'"
    if len(value.encode()) > 256 * 1024:
        return f"metadata {key}: the value is over 256 KiB"
    return None


_RESOURCE_NAME = r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?"
_NETWORK = re.compile(
    rf"{_RESOURCE_NAME}|(https://www\.googleapis\.com/compute/v1/)?projects/[a-z0-9:.-]+/"
    rf"(global/networks|regions/[a-z0-9-]+/subnetworks)/{_RESOURCE_NAME}"
)


def network_problem(text: str) -> str | None:
    if _NETWORK.fullmatch(text):
        return None
    return (
        f"{text!r} is not a network name (lowercase letters, digits and dashes, e.g. default) or a "
        "resource path (projects/P/global/networks/N, projects/P/regions/R/subnetworks/S)"
    )


def service_account_problem(text: str) -> str | None:
    if re.fullmatch(r"[a-z0-9][a-z0-9._-]*@[a-z0-9][a-z0-9.-]*\.[a-z]+", text) or text == "default":
        return None
    return f"{text!r} is not a service account e-mail (e.g. trainer@my-project.iam.gserviceaccount.com)"


def runtime_version_problem(text: str) -> str | None:
    if re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,62}", text):
        return None
    return f"{text!r} is not a TPU software version (e.g. tpu-ubuntu2204-base, v2-alpha-tpuv6e)"


def image_problem(text: str) -> str | None:
    if re.fullmatch(rf"projects/[a-z0-9:.-]+/global/images/(family/)?{_RESOURCE_NAME}", text):
        return None
    return (
        f"{text!r} is not a Compute Engine image path (projects/P/global/images/NAME or "
        "projects/P/global/images/family/FAMILY)"
    )


def reservation_problem(text: str) -> str | None:
    if re.fullmatch(
        rf"{_RESOURCE_NAME}|projects/[a-z0-9:.-]+/(locations|zones)/[a-z0-9-]+/reservations/{_RESOURCE_NAME}",
        text,
    ):
        return None
    return f"{text!r} is not a reservation name or path (projects/P/locations/ZONE/reservations/NAME)"


def scope_problem(text: str) -> str | None:
    if re.fullmatch(r"https://www\.googleapis\.com/auth/[a-z0-9._-]+", text):
        return None
    return f"{text!r} is not an OAuth scope URL (e.g. https://www.googleapis.com/auth/cloud-platform)"


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def endpoint_problem(text: str) -> str | None:
    """``tpu.googleapis.com``, ``host:port``, ``https://host[:port]``; plain http only to this machine
    (tests), because credentials would travel in the clear."""
    candidate = text if "://" in text else f"https://{text}"
    try:
        parts = urlsplit(candidate)
        port = parts.port
    except ValueError as exc:
        return f"{text!r} is not an API endpoint: {exc}"
    host = parts.hostname or ""
    if parts.scheme not in {"http", "https"} or not host:
        return f"{text!r} is not an API endpoint: expected HOST[:PORT] or https://HOST[:PORT]"
    if parts.path not in {"", "/"} or parts.query or parts.fragment or parts.username or parts.password:
        return f"{text!r}: an API endpoint is a host and port only (no path, query or user)"
    if not (is_loopback_host(host) or re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?", host)):
        return f"{text!r}: {host!r} is not a host name"
    if port is not None and not 1 <= port <= 65535:
        return f"{text!r}: port {port} is out of range"
    if parts.scheme == "http" and not is_loopback_host(host):
        return f"{text!r}: plain http would send your credentials in the clear; use https://"
    return None


_TOPOLOGY = re.compile(r"[1-9][0-9]*(x[1-9][0-9]*){1,2}")


def topology_problem(topology: str, dims: int, chips: int, accelerator: str) -> str | None:
    """``2x2x4``: as many dimensions as the generation's torus has, and as many chips as the accelerator
    type."""
    if not _TOPOLOGY.fullmatch(topology):
        return (
            f"{topology!r} is not a topology: expected chips per dimension like 2x2x4 (v4, v5p) or 4x4 "
            "(v5e, v6e)"
        )
    sizes = [int(x) for x in topology.split("x")]
    if len(sizes) != dims:
        example = "x".join(["2"] * dims)
        return f"{topology!r}: {accelerator.split('-')[0]} topologies have {dims} dimensions (e.g. {example})"
    product = 1
    for size in sizes:
        product *= size
    if product != chips:
        return f"{topology!r} is {product} chips, but accelerator {accelerator} has {chips}"
    return None
