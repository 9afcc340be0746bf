"""Backend venvs for tests that need torch / transformers / T5X: built once per machine through tpuft's own
cached-venv bootstrap (the same cache ``tpuft setup`` uses), so a test run after the quickstart reuses it in seconds."""

from __future__ import annotations

from pathlib import Path

from tpuft.backends.base import EnvSpec
from tpuft.paths import venv_cache

WHEELS = Path(__file__).resolve().parents[1].parent / "shared" / "wheels"
"""The wheelhouse beside the repository (here and in CI) standing in for t5x, airio and jestimator's git sources."""


def ensure(spec: EnvSpec) -> str:
    """The venv's python, building the venv first if this machine has not got it yet."""
    from tpuft.worker.bootstrap import ensure_venv

    return str(ensure_venv(venv_cache(), spec.payload()) / "bin" / "python")


def torch_spec() -> EnvSpec:
    """The PyTorch/XLA backend's CPU venv (torch, torch-xla, transformers 5): what the local pod trains with."""
    from tpuft.backends.torch_xla import BACKEND
    from tpuft.backends.torch_xla import TorchXlaBackend
    from tpuft.config import LocalConfig

    return BACKEND.env_spec(TorchXlaBackend(), "cpu", LocalConfig().python)


def torch_python() -> str:
    return ensure(torch_spec())


def t5x_spec() -> EnvSpec:
    """The T5X backend's CPU venv (jax, flax, seqio, TensorFlow CPU; t5x, airio, jestimator from ``WHEELS``)."""
    from tpuft.backends.t5x import BACKEND, T5xBackend
    from tpuft.config import LocalConfig

    backend = T5xBackend.model_validate({"family": "byt5", "size": "tiny", "t5x_source": str(WHEELS)})
    return BACKEND.env_spec(backend, "cpu", LocalConfig().python)


def t5x_python() -> str:
    return ensure(t5x_spec())


def keras_spec() -> EnvSpec:
    """The Keras backend's CPU venv (tensorflow-cpu, tf-keras, transformers 4.x): what the local pod trains with, and
    what writes the TF checkpoints the converter tests read."""
    from tpuft.backends.keras import BACKEND, KerasBackend
    from tpuft.config import LocalConfig

    return BACKEND.env_spec(KerasBackend(), "cpu", LocalConfig().python)


def keras_python() -> str:
    return ensure(keras_spec())


def tiny_wheel(folder: Path, name: str = "tpuft_tiny", requires: tuple[str, ...] = ()) -> Path:
    """A throwaway pure-Python wheel (``import <name>`` gives ``VALUE = 42``) written with zipfile, for tests of venv
    building that must not reach an index; ``requires`` become its Requires-Dist lines."""
    import base64
    import hashlib
    import zipfile

    info = f"{name}-0.1.dist-info"
    files = {
        f"{name}/__init__.py": "VALUE = 42\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\n"
        + f"Name: {name}\nVersion: 0.1\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tpuft-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel
