"""Launch variables that the controller sets for a worker's trainer and the worker reads by name, beyond the
run's identity in :class:`tpuft.worker.context.WorkerContext`: one spelling for both sides, so that
``ops/train`` need not import the worker's multislice module to name them.
"""

from __future__ import annotations

PORT_ENV = "TPUFT_MEGASCALE_PORT"
"""The controller's choice of the cross-slice coordinator's port when workers share an address (else the fixed
one)."""
TARGET_ENV = "TPUFT_TARGET"
"""``tpu`` or ``cpu``: what the launched hosts are (the cluster's shape), for what only a TPU's runtime
reads."""
