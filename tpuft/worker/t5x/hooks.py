"""tpuft's hooks into T5X, and ``t5x.train`` run in this process with them: how T5X's own loop reports to
tpuft.

T5X drives its training loop itself; tpuft patches it (once per process) and binds a seqio logger in the run
gin, each of which calls the active run (:class:`HookedRun`, the trainer's ``T5xRun``):

* the trainer's batch iterator: :meth:`HookedRun.on_batch` as each step's batch is taken (the ``next()``
  timed: the data wait of the run's goodput events, :class:`tpuft.worker.loop.framework.Timeline`);
* the trainer's ``train`` (a run of ``log_every`` steps): the sequencer's boundary before it
  (:class:`tpuft.worker.loop.framework.Boundaries`: checkpoints on demand through T5X's own checkpoint
  manager, a request inside the run splitting it, ``train.time_limit``, which leaves T5X's loop with
  :class:`~tpuft.worker.loop.framework.RunEnded`);
* the metrics writer (``MetricsManager._create_writer``): the train and teacher-forced eval scalars;
* the trainer's ``eval`` and seqio's ``Evaluator.evaluate``: the ``eval`` phase (long and quiet: the
  supervisor gives it more time), each an ``eval`` event;
* the Orbax checkpoint manager's ``save``: the ``checkpoint`` phase, then, once the save is complete,
  :meth:`HookedRun.on_checkpoint_saved`, and the save's ``checkpoint_save`` event;
* T5X's ``create_checkpoint_manager_and_restore``: a resumed run's ``checkpoint_restore`` event, timed;
* :class:`EvalLogger` (``seqio.Evaluator.logger_cls`` in the gin): the inference eval's metrics and
  predictions;
* the trainer's construction: :meth:`HookedRun.on_layout` with the mesh and how the parameters are sharded
  over it;
* on CPU, T5X's ``default_mesh``: T5X's own CPU mesh is hosts x devices per host whatever ``num_partitions``
  says, so the local pod would not rehearse the slice's replicas x partitions; :func:`cpu_mesh` cuts it as the
  recipe says; with several slices, JAX's hybrid mesh groups CPU devices by slice
  (:mod:`tpuft.worker.t5x.multislice`).

The run is found through a module global (:func:`activate`) because gin builds the seqio logger without
arguments.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from tpuft.worker.loop.framework import Boundaries, RunEnded, Timeline
from tpuft.worker.ondemand import Request
from tpuft.worker.t5x.multislice import install_cpu_slice_granules

BARRIER_SECONDS = 60.0
"""How long the hosts that have a checkpoint request wait for the others before they all refuse it."""

_MANAGER: list[Any] = []
"""T5X's checkpoint manager, as constructed (the hooks record it): what T5X itself saves with."""


class HookedRun(Protocol):
    """What the hooks call on the run in this process."""

    chief: bool
    timeline: Timeline
    boundaries: Boundaries

    def beat(
        self, step: int | None = None, status: str = "running", phase: str | None = None, **extra: Any
    ) -> None: ...

    def on_batch(self, absolute_step: int, first_of_run: bool, batch: Any = None) -> None: ...

    def on_train_scalars(self, absolute_step: int, scalars: dict[str, Any]) -> None: ...

    def on_eval_scalars(self, absolute_step: int, scalars: dict[str, Any]) -> None: ...

    def on_inference_eval(
        self, absolute_step: int, metrics: dict[str, Any], predictions: list[dict[str, Any]]
    ) -> None: ...

    def on_checkpoint_saved(self, absolute_step: int) -> None: ...

    def on_layout(self, layout: dict[str, Any]) -> None: ...

    @property
    def stopped_early(self) -> str | None: ...

    @property
    def stopped(self) -> str | None:
        """Why training ended before its last step (an early stop, the time limit), if it did."""
        ...


_ACTIVE: HookedRun | None = None
"""The run in this process, for the hooks T5X calls (its seqio logger is built by gin, without arguments)."""


def activate(run: HookedRun) -> None:
    global _ACTIVE
    _ACTIVE = run


def install_hooks() -> None:
    import seqio
    from clu import metric_writers
    from t5x import checkpoints as checkpoints_lib
    from t5x import partitioning
    from t5x import trainer as trainer_lib
    from t5x import utils as utils_lib

    if getattr(trainer_lib, "_tpuft_hooked", False):
        return
    trainer_lib._tpuft_hooked = True

    class TpuftWriter(metric_writers.MultiWriter):
        """Host 0's metric writer for one T5X metrics collection (``train``, or a task's teacher-forced
        eval)."""

        def __init__(self, name: str) -> None:
            super().__init__([])
            self.collection = name

        def write_scalars(self, step: int, scalars: Any) -> None:
            if _ACTIVE is None:
                return
            if self.collection == "train":
                _ACTIVE.on_train_scalars(int(step), dict(scalars))
            else:
                _ACTIVE.on_eval_scalars(int(step), dict(scalars))

    def create_writer(self: Any, name: str, summary_dir: str | None = None) -> Any:
        return TpuftWriter(name)

    trainer_lib.MetricsManager._create_writer = create_writer

    original_train = trainer_lib.BaseTrainer.train

    def train(self: Any, batch_iter: Any, num_steps: int, start_step: int | None = None) -> Any:
        def steps(count: int, start: int) -> Any:
            first = not getattr(self, "_tpuft_warm", False)
            self._tpuft_warm = True

            def beating() -> Any:
                for offset in range(count):
                    asked = time.time()
                    batch = next(batch_iter)
                    if _ACTIVE is not None:
                        _ACTIVE.timeline.batch_taken(start + offset, time.time() - asked)
                        _ACTIVE.on_batch(start + offset, first and offset == 0, batch)
                    yield batch

            return original_train(self, beating(), count, start_step=start)

        start = int(start_step if start_step is not None else self.train_state.step)
        if _ACTIVE is None:
            return steps(num_steps, start)
        _TRAINER[:] = [self]
        summary = _ACTIVE.boundaries.run_steps(steps, start, num_steps)  # the sequencer, between runs
        _ACTIVE.timeline.trained_to = start + num_steps
        return summary

    trainer_lib.BaseTrainer.train = train

    def in_phase(method: Any, phase: str) -> Any:
        def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
            if _ACTIVE is not None:
                _ACTIVE.beat(phase=phase)
            started = time.time()
            try:
                return method(self, *args, **kwargs)
            finally:
                if _ACTIVE is not None:
                    _ACTIVE.timeline.evaluated(started)
                    _ACTIVE.beat(phase="step")

        return wrapped

    # Evaluations are long and quiet (decoding every held-out example): the supervisor gives them more time.
    trainer_lib.BaseTrainer.eval = in_phase(trainer_lib.BaseTrainer.eval, "eval")
    seqio.Evaluator.evaluate = in_phase(seqio.Evaluator.evaluate, "eval")

    manager = checkpoints_lib.OrbaxCheckpointManagerInterface
    original_save = manager.save
    original_manager_init = manager.__init__

    def manager_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_manager_init(self, *args, **kwargs)
        _MANAGER[:] = [self]

    manager.__init__ = manager_init

    def save(self: Any, train_state: Any, state_transformation_fns: Any = (), force: bool = True) -> bool:
        from t5x import utils

        step = int(utils.get_local_data(train_state.step))
        if _ACTIVE is not None:
            _ACTIVE.beat(phase="checkpoint")
        started = time.time()
        saved = original_save(self, train_state, state_transformation_fns, force)
        if saved:
            self.wait_until_finished()
            if _ACTIVE is not None:
                _ACTIVE.on_checkpoint_saved(step)
                _ACTIVE.timeline.saved(step, started, _ACTIVE.stopped)
                _ACTIVE.beat(phase="step")
        return saved

    manager.save = save

    original_restore = utils_lib.create_checkpoint_manager_and_restore

    def create_and_restore(*args: Any, **kwargs: Any) -> Any:
        started = time.time()
        made = original_restore(*args, **kwargs)
        if _ACTIVE is not None:
            _ACTIVE.timeline.restored(started)
        return made

    utils_lib.create_checkpoint_manager_and_restore = create_and_restore

    original_init = trainer_lib.BaseTrainer.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if _ACTIVE is not None:
            _ACTIVE.on_layout(device_layout(self._partitioner.mesh, self.train_state.params))

    trainer_lib.BaseTrainer.__init__ = init

    from tpuft.worker.t5x import tpu_mesh

    tpu_mesh.install()  # the TPUs newer than T5X's table (v5e, v5p, v6e, TPU7x)
    original_mesh = partitioning.default_mesh

    def default_mesh(
        num_partitions: int,
        model_parallel_submesh: Any = None,
        backend: str | None = None,
        ici_mesh_shape: Any = None,
        dcn_mesh_shape: Any = None,
    ) -> Any:
        import jax

        if (
            jax.devices(backend)[-1].platform == "cpu"
            and not model_parallel_submesh
            and ici_mesh_shape is None
        ):
            return cpu_mesh(num_partitions, backend)
        return original_mesh(num_partitions, model_parallel_submesh, backend, ici_mesh_shape, dcn_mesh_shape)

    partitioning.default_mesh = default_mesh
    install_cpu_slice_granules()


def cpu_mesh(num_partitions: int, backend: str | None = None) -> Any:
    """The ``data`` x ``model`` mesh of the local pod's CPU devices: replicas x ``num_partitions``, cut from
    the devices in worker order, so a partition group lies within one worker (as on a TPU host, over its fast
    links) or spans whole workers. T5X's own CPU mesh ignores ``num_partitions`` (hosts x devices per
    host)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    devices = sorted(jax.devices(backend), key=lambda device: (device.process_index, device.id))
    if len(devices) % num_partitions:
        raise ValueError(f"num_partitions {num_partitions} does not divide the {len(devices)} CPU devices")
    return Mesh(np.array(devices, dtype=object).reshape(-1, num_partitions), ("data", "model"))


def device_layout(mesh: Any, params: Any) -> dict[str, Any]:
    """What the run really got: the mesh's shape and how many devices each host drives, and the parameters
    that are split over its axes (``model``; ``data`` too under ``train.sharding: fsdp``), read from the
    arrays on the devices (the largest one as the example)."""
    import jax

    sizes = {str(axis): int(size) for axis, size in mesh.shape.items()}
    sharded = []
    over: set[str] = set()
    total = 0
    for path, array in jax.tree_util.tree_flatten_with_path(params)[0]:
        total += 1
        spec = getattr(getattr(array, "sharding", None), "spec", None)
        named = [
            axis for entry in spec or () for axis in (entry if isinstance(entry, tuple) else (entry,)) if axis
        ]
        # an axis 1 device long splits nothing
        split = {str(axis) for axis in named if sizes.get(str(axis), 1) > 1}
        local = tuple(array.addressable_shards[0].data.shape) if split else tuple(array.shape)
        if local == tuple(array.shape):
            continue
        over |= split
        name = "/".join(str(getattr(key, "key", key)) for key in path)
        sharded.append((int(array.size), name, tuple(array.shape), str(spec), local))
    layout: dict[str, Any] = {
        "mesh": {str(axis): int(size) for axis, size in mesh.shape.items()},
        "hosts": jax.process_count(),
        "devices_per_host": jax.local_device_count(),
        "params": total,
        "params_sharded": len(sharded),
        "sharded_over": sorted(over),
    }
    if sharded:
        _, name, shape, spec, local = max(sharded)
        layout["example"] = {"name": name, "shape": list(shape), "spec": spec, "per_device": list(local)}
    return layout


class EvalLogger:
    """A seqio logger (bound in the run gin): the inference eval's metrics and decoded predictions to
    tpuft."""

    def __init__(self, output_dir: str | None = None) -> None:
        self.output_dir = output_dir

    def __call__(
        self, task_name: str, step: int | None, metrics: Any, dataset: Any, inferences: Any, targets: Any
    ) -> None:
        if _ACTIVE is None or not _ACTIVE.chief or step is None:
            return
        values = {name: getattr(value, "value", value) for name, value in (metrics or {}).items()}
        outputs = list((inferences or {}).get("output", []))
        predictions = []
        inputs = []
        if dataset is not None:
            for example in dataset.as_numpy_iterator():
                text = example.get("inputs_pretokenized")
                inputs.append(text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text))
                if len(inputs) >= len(outputs):
                    break
        for index, output in enumerate(outputs):
            target = targets[index] if targets is not None and index < len(targets) else None
            predictions.append(
                {
                    "input": inputs[index] if index < len(inputs) else None,
                    "prediction": _text(output),
                    "target": _text(target),
                }
            )
        _ACTIVE.on_inference_eval(int(step), values, predictions)


class EarlyStop:
    """A T5X action after each inference eval (``train.actions`` in the gin, for ``train.early_stopping``):
    stop when the run's judge (the shared early stopping of :mod:`tpuft.worker.loop`) has said so on the eval
    that
    :class:`EvalLogger` just reported. T5X asks host 0 and tells the others, then ends its loop."""

    def run(self, train_state: Any, metrics_by_task: Any) -> bool:
        return _ACTIVE is not None and _ACTIVE.stopped_early is not None


def exit_on_sigterm() -> None:
    """Stop at once on SIGTERM (``tpuft stop``, or the supervisor stopping this host because a peer failed).

    JAX's distributed runtime takes SIGTERM as a preemption notice that T5X never asks about at the pinned
    commit, so the process would run on until the supervisor's SIGKILL; and a host whose peer died is blocked
    inside a collective, where a Python signal handler never gets to run. So SIGTERM is blocked in every
    thread (threads started later inherit the mask) and taken by one thread that waits for it and exits the
    process. A checkpoint being written is left in its temporary folder, which Orbax and tpuft ignore."""
    import signal
    import threading

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def wait() -> None:
        signal.sigwait({signal.SIGTERM})
        print("[tpuft] SIGTERM: stopping this host's trainer", flush=True)
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=wait, name="tpuft-sigterm", daemon=True).start()


def run_t5x_train(gin_file: Path) -> None:
    """``python -m t5x.train --gin_file=...`` in this process: gin binds ``__main__.train``, so the module
    must run as ``__main__``; absl ends it with ``sys.exit``."""
    import logging

    # One warning per parameter that Adafactor does not factor (all of a small model's): noise in a worker's
    # log.
    logging.getLogger("absl").addFilter(lambda record: "falls back to heuristics" not in record.getMessage())
    argv = sys.argv
    sys.argv = ["t5x.train", f"--gin_file={gin_file}", "--verbosity=-1"]  # absl: warnings and up
    try:
        runpy.run_module("t5x.train", run_name="__main__", alter_sys=True)
    except RunEnded:  # the sequencer ended training at a boundary (train.time_limit), after the save
        pass
    except SystemExit as done:
        if done.code not in (None, 0):
            raise
    finally:
        sys.argv = argv


_TRAINER: list[Any] = []
"""The trainer whose ``train`` runs now: whose state a save between its runs of steps writes."""


def save_now(absolute: int) -> None:
    """T5X's manager saves the trainer's state at its step ``absolute`` (the hooks' wrapper beats, waits
    until it is written and lets the chief write the manifest); a step T5X has just saved itself is not
    written again."""
    if not _MANAGER:
        raise RuntimeError(
            "tpuft: T5X built no checkpoint manager (no checkpoint period?): cannot save on demand"
        )
    manager = _MANAGER[0]
    if absolute in set(manager.all_steps()):
        return
    manager.save(_TRAINER[0].train_state, (), True)


def agreed(request: Request) -> bool:
    """Every process has the request at this step (one process: always). JAX's coordination service barrier,
    named after the request, with :data:`BARRIER_SECONDS` of patience."""
    import jax

    if jax.process_count() == 1:
        return True
    from jax._src.distributed import global_state

    client = global_state.client
    if client is None:
        return True
    try:
        client.wait_at_barrier(f"tpuft-checkpoint-{request.id}", int(BARRIER_SECONDS * 1000))
    # a host that never came: the deadline, reported as an error by the service
    except Exception:  # noqa: BLE001
        return False
    return True


def any_host(flag: bool) -> bool:
    """Any process's ``flag``, on every process (one collective on several)."""
    from tpuft.worker.t5x.testset import gathered

    return any(values[0] for values in gathered([1.0 if flag else 0.0]))


def boundaries(run: Any) -> Boundaries:
    """The sequencer's boundaries of ``run`` (a ``T5xRun``), with T5X's acts."""
    return Boundaries(
        run.loop,
        run.timeline,
        save=save_now,
        agree_request=agreed,
        agree=any_host,
        barrier_seconds=BARRIER_SECONDS,
    )


def _text(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if hasattr(value, "tolist"):
        return value.tolist()
    return value
