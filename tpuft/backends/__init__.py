"""Training backends, keyed by the recipe's ``backend.kind`` (see :mod:`tpuft.backends.registry`)."""

from __future__ import annotations

from tpuft.backends.registry import get_backend, kinds

__all__ = ["get_backend", "kinds"]
