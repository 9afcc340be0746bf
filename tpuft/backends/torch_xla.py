"""PyTorch/XLA: one trainer process per worker host on the PJRT runtime.

On TPU hosts torch-xla drives the local chips and reduces gradients with XLA collectives over the ICI/DCN. On the
local CPU pod every worker is one PJRT CPU device, and gradients are averaged across workers with torch.distributed
over gloo (worker 0 is the rendezvous), so the run is data-parallel in the same way.
"""

from __future__ import annotations

from tpuft.backends.base import EnvSpec, Target
from tpuft.config import TorchXlaBackend

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
)


class TorchXla:
    kind = "torch_xla"

    def env_spec(self, backend_config: object, target: Target, python: str) -> EnvSpec:
        assert isinstance(backend_config, TorchXlaBackend)
        version = backend_config.torch_version
        xla = f"torch-xla[tpu]=={version}" if target == "tpu" else f"torch-xla=={version}"
        requirements = (f"torch=={version}", xla, *_COMMON, *backend_config.extra_requirements)
        return EnvSpec(kind=self.kind, requirements=requirements, python=python)

    def worker_env(self, target: Target) -> dict[str, str]:
        env = {"PJRT_DEVICE": "TPU" if target == "tpu" else "CPU", "TOKENIZERS_PARALLELISM": "false"}
        if target == "cpu":
            env["TF_CPP_MIN_LOG_LEVEL"] = "2"  # XLA's C++ start-up chatter, one block per worker
        return env

    def launch_workers(self, num_workers: int) -> list[int]:
        return list(range(num_workers))


BACKEND = TorchXla()
