"""Training backends, keyed by the recipe's ``backend.kind`` (see :mod:`tpuft.backends.registry`; a backend's
planner is :func:`tpuft.backends.base.get_backend`).

This ``__init__`` imports the registry only: the recipe (``config.recipe``) imports ``backends.registry``,
which runs this file first, so anything heavier here (the ``Backend`` protocol, which names the recipe) would
close an import circle.
"""

from __future__ import annotations

from tpuft.backends.registry import kinds

__all__ = ["kinds"]
