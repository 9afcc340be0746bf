"""The GCP provider (Cloud TPU VMs through the TPU v2 API), one module per concern; see :mod:`.provider`.

Importers use ``from tpuft.providers.gcp import GcpProvider``; the waits tests shorten live in :mod:`.tuning`.
The names below are loaded on first use (PEP 562), not with the package: a cold ``tpuft exec`` reads the
remembered workers (:mod:`.cache`, :mod:`.exec_plan`) through this package without paying for the provider's
imports (the cluster schema's pydantic models, Google's clients: most of a 0.2 s command).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpuft.providers.gcp.access import host_key_lines, known_hosts_host, write_known_hosts
    from tpuft.providers.gcp.api import GcpError
    from tpuft.providers.gcp.provider import GcpProvider

__all__ = ["GcpError", "GcpProvider", "host_key_lines", "known_hosts_host", "write_known_hosts"]

_HOMES = {
    "GcpError": "api",
    "GcpProvider": "provider",
    "host_key_lines": "access",
    "known_hosts_host": "access",
    "write_known_hosts": "access",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
