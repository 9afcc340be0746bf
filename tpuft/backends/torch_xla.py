"""PyTorch/XLA: one trainer process per worker host on the PJRT runtime.

On TPU hosts torch-xla drives the local chips and reduces gradients with XLA collectives over the ICI/DCN. On
the local CPU pod each worker exposes ``local.devices_per_worker`` PJRT CPU devices (the trainer sets
``CPU_NUM_DEVICES`` from ``TPUFT_LOCAL_DEVICES``), as many as a
host of the target slice has chips: with more than one, the worker runs one SPMD program over a 1-D mesh of
its own devices (the batch split over them, the weights replicated; with ``train.sharding: fsdp`` the weights
sharded too), so the run has the slice's replica count and per-replica batch. Gradients are averaged across
workers with torch.distributed over gloo (worker 0 is the rendezvous).

Multislice (``gcp.slices``): on TPU one SPMD program per host over ``HybridMesh``, the slices the outer
``data`` axis (:mod:`tpuft.worker.torch_xla.multislice`); on the CPU pod (``local.slices``) the workers are
the replicas slice by slice, each reading the data shard it would on the slices, and gloo reduces within each
slice, then across them.

What the CPU pod cannot rehearse: one global SPMD mesh across the worker processes. torch_xla's PJRT CPU
client is created per process with its own ``CPU_NUM_DEVICES`` and no distributed runtime (no coordinator, no
cross-process collectives; ``xr.global_runtime_device_count()`` is the process's own devices), so each
worker's mesh is local and workers meet over gloo instead of inside the step's graph. On a TPU slice an FSDP
mesh spans every host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpuft.backends.base import (
    ClusterShape,
    EnvSpec,
    KeyPath,
    LaunchPlan,
    Target,
    local_replicas,
    weight_digest_summary,
)
from tpuft.backends.spec import LOCAL_DEVICES_ENV, RunOutcome, compile_cache_env
from tpuft.backends.torch_xla_schema import CAPABILITIES, LAYOUT, TorchXlaBackend

if TYPE_CHECKING:
    from tpuft.config.recipe import RecipeConfig

__all__ = ["BACKEND", "CAPABILITIES", "LAYOUT", "TorchXla", "TorchXlaBackend"]

# Shared by every target: the worker's own needs (config loading, metrics, export) and the model stack.
_COMMON = (
    "transformers>=4.46,<6",
    "safetensors>=0.4",
    "sentencepiece>=0.2",
    "tensorboard>=2.15",
    "numpy>=1.26",
    "pydantic>=2.6",
    "pyyaml>=6",
    "google-cloud-storage>=2.14",  # a run dir in a bucket is mirrored from the worker (tpuft/storage/sync.py)
    "datasets>=4.0,<6",  # data.hf: streamed, sharded Hugging Face datasets (tpuft/worker/hf_data.py)
    "gcsfs>=2024.2",  # data.hf.data_files on gs://, read by datasets through fsspec
    "accelerate>=1.0",  # transformers' Seq2SeqTrainer, the baseline of benchmarks/train_step.py
)


class TorchXla:
    kind = "torch_xla"
    config_model = TorchXlaBackend
    layout = LAYOUT
    capabilities = CAPABILITIES

    def env_spec(self, backend_config: object, target: Target, python: str) -> EnvSpec:
        assert isinstance(backend_config, TorchXlaBackend)
        version = backend_config.torch_version
        xla = f"torch-xla[tpu]=={version}" if target == "tpu" else f"torch-xla=={version}"
        requirements = (f"torch=={version}", xla, *_COMMON, *backend_config.extra_requirements)
        return EnvSpec(kind=self.kind, requirements=requirements, python=python)

    @staticmethod
    def replicas(shape: ClusterShape) -> int:
        """Data-parallel copies: one per TPU device on TPU hosts (a chip; each of a v2/v3 chip's two
        TensorCores), one per CPU device of every worker on the CPU pod."""
        return (
            shape.chips * shape.devices_per_chip
            if shape.target == "tpu"
            else shape.hosts * shape.local_devices
        )

    def check(self, recipe: RecipeConfig, shape: ClusterShape) -> list[tuple[KeyPath, str]]:
        replicas = self.replicas(shape)
        if shape.target == "tpu":
            what = (
                f"{replicas} replicas ({shape.hosts} hosts x "
                f"{shape.chips_per_host * shape.devices_per_chip} devices)"
            )
        else:
            what = local_replicas(shape, replicas)
        batch, accum = recipe.train.batch_size, recipe.train.grad_accum_steps
        data = recipe.data
        spmd = (
            "train.sharding: fsdp"
            if recipe.train.sharding == "fsdp"
            else (f"{shape.slices} slices (Multislice)" if shape.slices > 1 else None)
        )
        if (data.test is not None or (data.hf is not None and data.hf.test_split is not None)) and (
            spmd and shape.target == "tpu" and shape.hosts > 1
        ):
            key = ("data", "test") if data.hf is None else ("data", "hf", "test_split")
            return [
                (
                    key,
                    f"the test evaluation of {spmd} runs on one TPU host only ({shape.hosts} here: one SPMD "
                    "program spans them and a host cannot read back its own decodes); drop it and run tpuft "
                    "predict on the run's checkpoint",
                )
            ]
        unit = replicas * accum
        if batch % unit:
            split = f"{what} x {accum} accumulation steps" if accum > 1 else what
            return [
                (
                    ("train", "batch_size"),
                    f"{batch} does not split evenly over {split} (use a multiple of {unit}, "
                    f"e.g. {max(unit, batch // unit * unit)})",
                )
            ]
        return []

    def plan(self, recipe: RecipeConfig, shape: ClusterShape) -> LaunchPlan:
        env = {"PJRT_DEVICE": "TPU" if shape.target == "tpu" else "CPU", "TOKENIZERS_PARALLELISM": "false"}
        env.update(compile_cache_env(recipe.train.compile_cache, self.kind, shape.target))
        if shape.target == "cpu":
            env["TF_CPP_MIN_LOG_LEVEL"] = "2"  # XLA's C++ start-up chatter, one block per worker
            # CPU_NUM_DEVICES; SPMD over them when more than one
            env[LOCAL_DEVICES_ENV] = str(shape.local_devices)
        if (recipe.train.sharding == "fsdp" or shape.slices > 1) and shape.target == "tpu":
            env["XLA_USE_SPMD"] = (
                "1"  # one SPMD process per host (the trainer calls use_spmd() too), HybridMesh
            )
        return LaunchPlan(workers=tuple(range(shape.hosts)), env=env)

    def summarize(self, outcome: RunOutcome, launched: int) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        return weight_digest_summary(outcome, launched)


BACKEND = TorchXla()
