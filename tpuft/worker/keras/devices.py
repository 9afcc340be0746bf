"""The Keras trainer's strategy on the local CPU pod, with several devices per worker:
``local.devices_per_worker`` (``TPUFT_LOCAL_DEVICES``, set by the launch plan) logical CPU devices, each one a
replica, so that a worker rehearses a TPU host's chips: the run has the slice's replica count and per-replica
batch.

Why a patch: ``MultiWorkerMirroredStrategy`` takes a worker's local devices from its GPUs or TPUs and falls
back to one CPU device per worker (TF 2.20, ``CollectiveAllReduceExtended._initialize_local_devices``), so
logical CPU devices are never replicas of a multi-worker run. The rest of the strategy does not care what the
devices are (the collective group is local devices x workers; the RING collectives run between CPU devices),
so tpuft swaps that one choice, while the strategy is built, for the worker's logical CPU devices, and checks
``num_replicas_in_sync`` afterwards. One worker alone runs ``MirroredStrategy`` over its devices (the same
semantics, no cluster). TensorFlow is passed in: this module imports without it.
"""

from __future__ import annotations

import os
from typing import Any

from tpuft.backends.spec import LOCAL_DEVICES_ENV


def local_devices() -> int:
    """The CPU devices this worker was given (1 when the plan did not say)."""
    return int(os.environ.get(LOCAL_DEVICES_ENV) or 1)


def split_cpu(tf: Any, devices: int) -> None:
    """Make ``devices`` logical CPU devices of the one physical CPU (before TensorFlow's runtime starts)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * devices)


def cpu_strategy(tf: Any, devices: int, workers: int, options: Any) -> Any:
    """A strategy whose replicas are every logical CPU device of every worker (``devices`` > 1)."""
    split_cpu(tf, devices)
    if workers == 1:
        return tf.distribute.MirroredStrategy([f"/device:CPU:{i}" for i in range(devices)])
    from tensorflow.python.distribute import collective_all_reduce_strategy as collective

    extended = collective.CollectiveAllReduceExtended
    original = getattr(extended, "_initialize_local_devices", None)
    if original is None:
        raise RuntimeError(
            f"this TensorFlow ({tf.__version__}) has no CollectiveAllReduceExtended."
            "_initialize_local_devices: set local.devices_per_worker: 1 for the Keras backend"
        )

    def every_cpu(self: Any, resolver: Any, worker_device: str) -> tuple[tuple[str, ...], str]:
        found, kind = original(self, resolver, worker_device)
        if kind != "CPU":
            return found, kind
        return tuple(f"{worker_device}/device:CPU:{i}" for i in range(devices)), kind

    extended._initialize_local_devices = every_cpu
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    finally:
        extended._initialize_local_devices = original
    if strategy.num_replicas_in_sync != workers * devices:
        raise RuntimeError(
            f"MultiWorkerMirroredStrategy has {strategy.num_replicas_in_sync} replicas, not "
            f"{workers} workers x {devices} CPU devices"
        )
    return strategy
