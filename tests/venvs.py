"""Backend venvs for tests that need torch / transformers / T5X: built once per machine through tpuft's own
cached-venv bootstrap (the same cache ``tpuft setup`` uses), so a test run after the quickstart reuses it in
seconds."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from tpuft.backends.base import EnvSpec
from tpuft.core.paths import venv_cache

WHEELS = Path(__file__).resolve().parents[1].parent / "shared" / "wheels"
"""The wheelhouse beside the repository (here and in CI) standing in for t5x, airio and jestimator's git
sources."""
T5X_SOURCE_ENV = "TPUFT_T5X_SOURCE"
"""Where the T5X tests take t5x, airio and jestimator from: a checkout, a t5x wheel or a wheelhouse (as
``backend.t5x_source``), or ``git`` for their pinned git repositories (the network); unset, ``WHEELS`` if
present."""
T5X_SOURCES_MISSING = (
    "T5X sources not available: set TPUFT_T5X_SOURCE to a t5x checkout/wheelhouse, "
    "or allow git access (TPUFT_T5X_SOURCE=git)"
)


def t5x_source() -> tuple[str | None, str | None]:
    """(``backend.t5x_source`` for the T5X tests, why they cannot have one): the one place the tests resolve
    it. A clone of the repository alone (a contributor's, a packager's) has no ``WHEELS`` beside it and its
    tests run offline, so without ``TPUFT_T5X_SOURCE`` the T5X tests are skipped with the reason instead of
    failing every test session at collection; the source is then the default (git), which the quick tests only
    compare keys of."""
    from pydantic import ValidationError

    from tpuft.backends.t5x import T5xBackend

    chosen = os.environ.get(T5X_SOURCE_ENV, "").strip()
    if chosen == "git":
        return None, None
    if not chosen and not WHEELS.is_dir():
        return None, T5X_SOURCES_MISSING
    try:
        backend = T5xBackend.model_validate(
            {"family": "byt5", "size": "tiny", "t5x_source": chosen or str(WHEELS)}
        )
    except ValidationError as exc:
        problem = "; ".join(str(error["msg"]).removeprefix("Value error, ") for error in exc.errors())
        return (
            None,
            f"{T5X_SOURCES_MISSING}: {T5X_SOURCE_ENV if chosen else 'the test wheelhouse'}: {problem}",
        )
    return backend.t5x_source, None


def t5x_source_settings() -> list[str]:
    """The ``--set`` that gives a T5X recipe the tests' source (none for the git default)."""
    source, _ = t5x_source()
    return [] if source is None else ["--set", f"backend.t5x_source={source}"]


def ensure(spec: EnvSpec) -> str:
    """The venv's python, building the venv first if this machine has not got it yet."""
    from tpuft.host.bootstrap import ensure_venv

    return str(ensure_venv(venv_cache(), spec.payload()) / "bin" / "python")


def torch_spec() -> EnvSpec:
    """The PyTorch/XLA backend's CPU venv (torch, torch-xla, transformers 5): what the local pod trains
    with."""
    from tpuft.backends.torch_xla import BACKEND, TorchXlaBackend
    from tpuft.config import LocalConfig

    return BACKEND.env_spec(TorchXlaBackend(), "cpu", LocalConfig().python)


def torch_python() -> str:
    return ensure(torch_spec())


def t5x_spec() -> EnvSpec:
    """The T5X backend's CPU venv (jax, flax, seqio, TensorFlow CPU; t5x, airio, jestimator from
    :func:`t5x_source`)."""
    from tpuft.backends.t5x import BACKEND, T5xBackend
    from tpuft.config import LocalConfig

    backend = T5xBackend.model_validate({"family": "byt5", "size": "tiny", "t5x_source": t5x_source()[0]})
    return BACKEND.env_spec(backend, "cpu", LocalConfig().python)


def t5x_python() -> str:
    return ensure(t5x_spec())


def keras_spec() -> EnvSpec:
    """The Keras backend's CPU venv (tensorflow-cpu, tf-keras, transformers 4.x): what the local pod trains
    with, and what writes the TF checkpoints the converter tests read."""
    from tpuft.backends.keras import BACKEND, KerasBackend
    from tpuft.config import LocalConfig

    return BACKEND.env_spec(KerasBackend(), "cpu", LocalConfig().python)


def keras_python() -> str:
    return ensure(keras_spec())


def tracking_spec() -> EnvSpec:
    """The tracker sidecar's venv (wandb, mlflow): what the tracking tests and the e2e quickstarts' trackers
    use."""
    from tpuft.config import LocalConfig
    from tpuft.config.tracking_env import tracking_spec as spec

    return spec(LocalConfig().python)


def tracking_python() -> str:
    return ensure(tracking_spec())


SPECS: dict[str, Callable[[], EnvSpec]] = {
    "torch_xla": torch_spec,
    "keras": keras_spec,
    "t5x": t5x_spec,
    "tracking": tracking_spec,
}
FIXTURES = {
    "torch_python": "torch_xla",
    "keras_python": "keras",
    "t5x_python": "t5x",
    "tracking_python": "tracking",
}
"""The session fixtures that hand a test a backend's python; a test that gets a venv through ``tpuft setup``
instead (the e2e quickstarts) says so with ``pytest.mark.backend_venvs(KIND, ...)``."""


def wanted(items: Iterable[object]) -> list[str]:
    """The backend venvs the tests ``items`` need (pytest items), in the order they first need them; a skipped
    test (the T5X ones without sources) needs none."""
    kinds: list[str] = []
    for item in items:
        if item.get_closest_marker("skip") is not None:  # type: ignore[attr-defined]
            continue
        marker = item.get_closest_marker("backend_venvs")  # type: ignore[attr-defined]
        found = [FIXTURES[name] for name in item.fixturenames if name in FIXTURES]  # type: ignore[attr-defined]
        for kind in [*found, *(marker.args if marker else ())]:
            if kind not in kinds:
                kinds.append(kind)
    return kinds


def prebuild(kinds: list[str], log: Path) -> subprocess.Popen[bytes] | None:
    """Build the venvs of ``kinds`` that this machine lacks in a child process, one after another, while the
    quick tests run: on a new machine (CI) their downloads and installs (about 4 minutes here) then overlap
    with tests instead of adding to them. The child runs at the lowest CPU priority: the quick tests leave
    most of 2 cores idle (they wait on processes and sockets), and the build takes only that; at the same
    priority pip's unpacking and byte-compiling slowed them down by more than the build took. A test that
    needs one waits on the build's lock (``bootstrap.ensure_venv``); one the child failed to build, the test
    builds itself and shows the error."""
    from tpuft.host.bootstrap import is_ready

    missing = [kind for kind in kinds if not is_ready(venv_cache() / SPECS[kind]().key)]
    if not missing:
        return None
    with log.open("wb") as out:
        return subprocess.Popen(
            ["nice", "-n", "19", sys.executable, "-m", "tests.venvs", *missing],
            cwd=Path(__file__).resolve().parents[1],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # Its own process group (killed whole at the session's end) but not its own session: with the
            # kernel's autogroup scheduling (most distributions), a new session is a new CPU group with an
            # equal share whatever its nice, and the build would take half of the quick tests' cores.
            preexec_fn=os.setpgrp,
        )


def tiny_wheel(
    folder: Path, name: str = "tpuft_tiny", requires: tuple[str, ...] = (), version: str = "0.1"
) -> Path:
    """A throwaway pure-Python wheel (``import <name>`` gives ``VALUE = 42``) written with zipfile, for tests
    of venv building that must not reach an index; ``requires`` become its Requires-Dist lines."""
    import base64
    import hashlib
    import zipfile

    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": "VALUE = 42\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\n"
        + f"Name: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tpuft-tests\nRoot-Is-Purelib: true\nTag: "
        "py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


if __name__ == "__main__":  # the child of :func:`prebuild`
    failed = 0
    for kind in sys.argv[1:]:
        try:
            print(f"{kind}: {ensure(SPECS[kind]())}", flush=True)
        except Exception as exc:  # noqa: BLE001 - the test that needs it builds it again and fails with the cause
            print(f"{kind}: not built: {exc}", flush=True)
            failed += 1
    sys.exit(1 if failed else 0)
