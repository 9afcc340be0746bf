"""``python -m tpuft.worker.t5x.compile REQUEST.json``: compile a T5X run's real train step for a TPU slice
that this machine does not have, and print what the compiled step needs per device, as one JSON object on
stdout.

Why a compile and not arithmetic: the paper estimate (:mod:`tpuft.model.summary`) knows the parameters and the
optimizer's slots, but not XLA's temporaries (activations kept for the backward pass, the fusion buffers, the
gradients' all-reduce), which decide whether a step fits. libtpu can describe any slice's devices without
owning one (``jax.experimental.topologies.get_topology_desc``), and XLA's TPU compiler then compiles a sharded
step for those devices on the CPU: the compiled executable's ``memory_analysis()`` is what the TPU runtime
would allocate per device, and ``cost_analysis()`` its flops. This is how MaxText's ``train_compile.py``
checks memory ahead of time.

Runs inside the T5X backend's CPU venv with the libtpu wheel on ``PYTHONPATH`` (the controller builds both,
:mod:`tpuft.backends.t5x_compile`); nothing is materialised: the train state's shapes come from
``jax.eval_shape`` (T5X's :class:`t5x.utils.TrainStateInitializer`) and the batch is ``ShapeDtypeStruct``s.
What is compiled is what ``t5x.train`` compiles: the model, partitioner, optimizer and trainer (microbatches,
learning-rate schedule) the run's own gin builds (:func:`tpuft.worker.t5x.gin.run_gin`, with the TPU's
``bfloat16``), the trainer's partitioned ``train_with_lr`` with the train state donated, over a mesh of the
topology's devices instead of ``jax.devices()``.

The request: ``{"recipe": <resolved recipe YAML>, "topology": {"name", "chip_config", "chips_per_host_bounds",
"num_slices"}}``. A step that does not fit is compiled all the same (libtpu's ``--xla_tpu_no_crash_on_oom``,
set by the plan): XLA's TPU compiler still fits it as well as it can (rematerialising, reordering), then
reports the bytes instead of refusing with the temporaries' size alone; the verdict is the controller's. A
problem the user can fix (a num_partitions that does not divide the devices, a gin that does not parse) is
printed as ``{"error": ...}`` with exit code 2.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tpuft.config import recipe_from_text
from tpuft.worker.t5x import tpu_mesh
from tpuft.worker.t5x.gin import initial_step, run_gin, task_spec

USAGE_EXIT = 2


class _TopologyJax:
    """``jax`` as ``t5x.partitioning`` sees it while it builds the mesh and shards activations: the topology's
    devices instead of this CPU's (T5X's ``default_mesh`` reads ``jax.devices()``, and its
    ``with_sharding_constraint`` is a no-op when the first device is a CPU). Everything else is the real
    module."""

    def __init__(self, real: Any, devices: list[Any]) -> None:
        self._real = real
        self._devices = devices

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def devices(self, backend: str | None = None) -> list[Any]:
        return list(self._devices)

    def local_devices(self, process_index: int | None = None, backend: str | None = None) -> list[Any]:
        index = 0 if process_index is None else process_index
        return [d for d in self._devices if d.process_index == index]

    def process_count(self) -> int:
        return len({d.process_index for d in self._devices})

    def local_device_count(self, backend: str | None = None) -> int:
        return len(self.local_devices(0))


def _configured_train_args(gin_file: Path) -> dict[str, Any]:
    """The arguments the run's gin gives ``t5x.train.train`` (model, partitioner, trainer_cls, the train
    dataset's config, ...), evaluated by gin exactly as ``t5x.train`` would, without running its loop."""
    import gin
    import t5x
    from t5x import gin_utils

    import __main__

    captured: dict[str, Any] = {}

    def train(**kwargs: Any) -> None:  # gin binds `__main__.train`: t5x.train runs as __main__
        captured.update(kwargs)

    __main__.train = train
    gin.clear_config()
    search = [str(Path(t5x.__file__).resolve().parents[1])]
    gin_utils.parse_gin_flags(gin_search_paths=search, gin_files=[str(gin_file)], gin_bindings=[])
    gin.get_configurable(train)()
    return captured


def offline_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The task spec with a vocabulary this machine can build: a SentencePiece model that is not here
    (``gs://``, or a path on the workers only) becomes the byte vocabulary. The step's shapes do not change:
    the network's ``vocab_size`` is the model gin's binding (or the recipe's ``gin_overrides``), and the
    vocabulary object is used only to encode data and decode predictions, which a compile does neither of."""
    vocab = spec["vocabulary"]
    if vocab != "byt5" and (vocab.startswith("gs://") or not Path(vocab).is_file()):
        return {**spec, "vocabulary": "byt5"}
    return spec


def compile_step(request: dict[str, Any]) -> dict[str, Any]:
    import jax
    import numpy as np
    from jax.experimental import topologies
    from t5x import partitioning, utils

    recipe = recipe_from_text(request["recipe"], "recipe.yaml", check_files=False)
    topo = request["topology"]
    started = time.monotonic()
    desc = topologies.get_topology_desc(
        topology_name=topo["name"],
        platform="tpu",
        chip_config_name=topo["chip_config"],
        chips_per_host_bounds=tuple(topo["chips_per_host_bounds"]),
        num_slices=topo.get("num_slices", 1),
    )
    devices = list(desc.devices)
    with tempfile.TemporaryDirectory(prefix="tpuft-compile-") as folder:
        gin_file = Path(folder) / "run.gin"
        spec = offline_spec(task_spec("compile", recipe))
        gin_file.write_text(
            run_gin(
                recipe,
                spec,
                model_dir=f"{folder}/checkpoints",
                initial_step=initial_step(recipe),
                cpu=False,
                slices=topo.get("num_slices", 1),
                devices=len(devices),
            ),
            encoding="utf-8",
        )
        args = _configured_train_args(gin_file)
    model, partitioner, dataset = args["model"], args["partitioner"], args["train_dataset_cfg"]
    tpu_mesh.install()  # as the trainer has it: the TPUs newer than T5X's mesh table
    real_jax = partitioning.jax
    partitioning.jax = _TopologyJax(real_jax, devices)
    try:
        mesh = partitioner.mesh
        converter = model.FEATURE_CONVERTER_CLS(pack=dataset.pack)
        lengths = converter.get_model_feature_lengths(dataset.task_feature_lengths)
        batch_size = dataset.batch_size
        input_shapes = {name: (batch_size, length) for name, length in lengths.items()}
        input_types = {name: np.int32 for name in lengths}
        initializer = utils.TrainStateInitializer(
            optimizer_def=model.optimizer_def,
            init_fn=model.get_initial_variables,
            input_shapes=input_shapes,
            input_types=input_types,
            partitioner=partitioner,
        )
        trainer = args["trainer_cls"](
            model=model,
            train_state=initializer.global_train_state_shape,
            partitioner=partitioner,
            eval_names=[],
            summary_dir=None,
            train_state_axes=initializer.train_state_axes,
            rng=jax.random.PRNGKey(0),
        )
        batch = {name: jax.ShapeDtypeStruct(shape, np.int32) for name, shape in input_shapes.items()}
        lowered = trainer._partitioned_train_step.lower(initializer.global_train_state_shape, batch)
        traced = time.monotonic()
        compiled = lowered.compile()
    finally:
        partitioning.jax = real_jax
    elapsed = time.monotonic() - started
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    if isinstance(cost, list):  # older jax: one dict per computation
        cost = cost[0] if cost else {}
    params = sum(
        int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(initializer.global_train_state_shape.params)
    )
    return {
        "devices": len(devices),
        "device_kind": devices[-1].device_kind,
        "hosts": len({d.process_index for d in devices}),
        "slices": len({getattr(d, "slice_index", 0) for d in devices}),
        "mesh": {name: int(size) for name, size in mesh.shape.items()},
        "num_microbatches": getattr(trainer, "_num_microbatches", None),
        "global_batch": batch_size,
        "feature_lengths": {name: int(length) for name, length in lengths.items()},
        "params": params,
        "argument_bytes": int(memory.argument_size_in_bytes),
        "output_bytes": int(memory.output_size_in_bytes),
        "alias_bytes": int(memory.alias_size_in_bytes),
        "temp_bytes": int(memory.temp_size_in_bytes),
        "generated_code_bytes": int(memory.generated_code_size_in_bytes),
        "flops_per_device": float(cost.get("flops", 0.0)) if cost else 0.0,
        "compile_s": round(elapsed, 2),
        # XLA's part of compile_s; the rest is the topology, gin, the shapes and the lowering
        "xla_compile_s": round(started + elapsed - traced, 2),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tpuft.worker.t5x.compile REQUEST.json", file=sys.stderr)
        return USAGE_EXIT
    request = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    try:
        result = compile_step(request)
    except (
        ValueError
    ) as exc:  # T5X's own refusals of a mesh or a binding: the user's settings, said in one line
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:500]}))
        return USAGE_EXIT
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
