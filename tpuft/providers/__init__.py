"""Where workers come from. ``get_provider`` picks the implementation named by the cluster file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpuft.core.records import Cluster, Worker
from tpuft.providers.base import Provider

if TYPE_CHECKING:  # the records above are imported by the worker-facing fleet code; keep pydantic out of it
    from tpuft.config import ClusterConfig

__all__ = ["Cluster", "Provider", "Worker", "get_provider"]


def get_provider(config: ClusterConfig) -> Provider:
    if config.provider == "local":
        from tpuft.providers.local import LocalProvider

        return LocalProvider(config)
    if config.provider == "gcp":
        from tpuft.providers.gcp import GcpProvider

        return GcpProvider(config)
    raise AssertionError(f"unhandled provider {config.provider!r}")  # the config model admits no other value
