"""The GCP provider (Cloud TPU VMs through the TPU v2 API), one module per concern; see :mod:`.provider`.

Importers use ``from tpuft.providers.gcp import GcpProvider``; the waits tests shorten live in :mod:`.tuning`.
"""

from __future__ import annotations

from tpuft.providers.gcp.access import host_key_lines, known_hosts_host, write_known_hosts
from tpuft.providers.gcp.api import GcpError
from tpuft.providers.gcp.provider import GcpProvider

__all__ = ["GcpError", "GcpProvider", "host_key_lines", "known_hosts_host", "write_known_hosts"]
