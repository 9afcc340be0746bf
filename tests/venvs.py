"""Backend venvs for tests that need torch / transformers: built once per machine through tpuft's own cached-venv
bootstrap (the same cache ``tpuft setup`` uses), so a test run after the quickstart reuses it in seconds."""

from __future__ import annotations

from tpuft.backends.base import EnvSpec
from tpuft.paths import venv_cache


def ensure(spec: EnvSpec) -> str:
    """The venv's python, building the venv first if this machine has not got it yet."""
    from tpuft.worker.bootstrap import ensure_venv

    payload = {"key": spec.key, "requirements": list(spec.requirements), "python": spec.python, "pip_args": list(spec.pip_args)}
    return str(ensure_venv(venv_cache(), payload) / "bin" / "python")


def torch_spec() -> EnvSpec:
    """The PyTorch/XLA backend's CPU venv (torch, torch-xla, transformers 5): what the local pod trains with."""
    from tpuft.backends.torch_xla import BACKEND
    from tpuft.backends.torch_xla import TorchXlaBackend
    from tpuft.config import LocalConfig

    return BACKEND.env_spec(TorchXlaBackend(), "cpu", LocalConfig().python)


def torch_python() -> str:
    return ensure(torch_spec())



KERAS_STACK = ("tensorflow==2.19.1", "tf-keras==2.19.0", "transformers==4.57.6", "h5py", "numpy")
"""TensorFlow + transformers 4.x (5.x removed TensorFlow): what reads and writes Keras/TF T5 checkpoints."""


def keras_python() -> str:
    from tpuft.config import LocalConfig

    return ensure(EnvSpec(kind="keras", requirements=KERAS_STACK, python=LocalConfig().python))
