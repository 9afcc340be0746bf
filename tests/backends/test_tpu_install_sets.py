"""The TPU install sets resolve: each backend's TPU venv (``env_spec(config, "tpu", ...)``) is resolved by pip
for the TPU VM image's Python and platform, binary-only and without installing anything, so a pin that cannot
co-install on a TPU VM fails here and not on the user's first paid node. docs/tpu-wheels.md says what is
resolved and what is not.

How: one ``pip install --dry-run --report`` per (backend, Python), all at once in threads, with the project
venv's pip (``--isolated``: plain PyPI, as a TPU worker sees it, not this machine's pip configuration),
``--python-version`` / ``--abi`` / ``--implementation cp`` and the manylinux tags of Ubuntu 22.04 (glibc 2.35,
x86_64), the base of the TPU VM images. ``--use-feature=fast-deps`` reads each wheel's metadata with HTTP
range requests: without it (and without PEP 658 metadata from the index) a dry run downloads every wheel, 4 GB
for PyPI's CUDA torch alone.

What cannot be checked offline (the package registries are the only network here and in CI):

* T5X's ``no_deps`` (t5x, airio and jestimator from their git repositories): not resolved; their own
  dependency lists are the reason they are installed with ``--no-deps``.
* Keras's ``-f https://storage.googleapis.com/libtpu-tf-releases/index.html`` (the TPU worker's pip reads it;
  it is not reachable here): the set is resolved from PyPI alone. tensorflow-tpu 2.20 asks for
  ``libtpu~=0.0.14``, which PyPI has (0.0.21 is its newest build for Python 3.10), so the set co-installs; the
  worker may get a newer libtpu if that index has one, and whether that libtpu, or PyPI's, runs TF 2.20 on a
  chip only a TPU can tell.
* Keras's ``tf-keras`` (installed with ``--no-deps``) is resolved alone and its own requirements are checked
  against the resolved set (its ``tensorflow`` is TF's TPU or CPU wheel under another name).

Needs the package index: skipped when it is not reachable within a few seconds, except under ``CI=true``
(failed).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tpuft.backends.base import EnvSpec, get_backend
from tpuft.backends.keras import TF_VERSION
from tpuft.backends.registry import schema
from tpuft.backends.t5x import JAX_VERSION, MAX_PYTHON, MIN_PYTHON
from tpuft.backends.t5x_compile import LIBTPU_FOR_JAX

# about 30 s of pip's CPU (six resolutions of ~110 wheels' metadata) and the network
pytestmark = pytest.mark.slow

IMAGE_PYTHON = "3.10"
"""The Python of the Ubuntu 22.04 TPU VM images (tpu-ubuntu2204-base, v2-alpha-tpuv4-pod, v2-alpha-tpuv5/v6e,
and Keras's tpu-vm-tf-2.20.0-pjrt)."""
PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(35, 4, -1)),
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
)
"""What pip accepts on glibc 2.35, newest first: pip does not widen a ``--platform`` to the older manylinux
tags."""
SDIST_ONLY = ("promise==2.3",)
"""Pure-Python dependencies that PyPI has only as source (T5X's tensorflow-datasets needs promise): the
worker's pip builds them, a binary-only dry run cannot, so they are built into wheels here first and offered
with ``--find-links``. Another name in pip's 'No matching distribution' here may belong on this list."""
UNREACHABLE_OPTIONS = ("-f", "--find-links", "--extra-index-url", "-i", "--index-url")
"""pip options naming an index other than PyPI: dropped (with their URL) from the resolution, and named in
it."""
TENSORFLOW_WHEELS = ("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tensorflow-intel")
"""The distributions that each install the ``tensorflow`` package: two in one venv overwrite each other's
files."""
PIP_TIMEOUT_S = 420
PIP_MAJOR = 26
"""The oldest pip whose fast-deps dry run reads metadata only (25.0 still downloads every wheel)."""
INDEX = "https://pypi.org/simple/pip/"


@dataclass(frozen=True)
class Case:
    kind: str
    python: str

    @property
    def id(self) -> str:
        return f"{self.kind}-py{self.python}"


def _minor_below(version: str) -> str:
    major, minor = version.split(".")[:2]
    return f"{major}.{int(minor) - 1}"


def _minor_above(version: str) -> str:
    major, minor = version.split(".")[:2]
    return f"{major}.{int(minor) + 1}"


CASES = (
    Case("t5x", MIN_PYTHON),
    Case("t5x", MAX_PYTHON),
    Case("torch_xla", IMAGE_PYTHON),
    Case("keras", IMAGE_PYTHON),
)
"""T5X on each Python the worker's bootstrap may build its venv from (the newest python3.N in MIN_PYTHON ..
MAX_PYTHON found on the worker); the others on the image's own."""
BELOW_FLOOR = Case("t5x", _minor_below(MIN_PYTHON))
"""T5X one Python below MIN_PYTHON: must not resolve, or MIN_PYTHON (and the bootstrap's search for a newer
interpreter on the TPU image) is stricter than the pins."""
PAST_CEILING = Case("t5x", _minor_above(MAX_PYTHON))
"""T5X one Python past MAX_PYTHON: must not resolve as wheels (seqio's editdistance has none for 3.13), or the
bootstrap's ceiling can go up."""

T5X_CASES = tuple(case for case in CASES if case.kind == "t5x")

# Known problems of the sets as the backends state them (reported, not fixed here: the pins are the
# backends'). Each is a strict xfail: fixing the pin makes its test pass, and so fail here until the entry
# goes.
DOES_NOT_RESOLVE: dict[Case, str] = {}
CUDA_TORCH = {
    Case("torch_xla", IMAGE_PYTHON): "PyPI's torch for Linux x86_64 is the CUDA build: torch==2.9.0 pulls 15 "
    "nvidia-* wheels and triton (about 3 GB) onto the TPU host; the CPU build is on PyTorch's own index",
}
TWO_TENSORFLOWS = dict.fromkeys(
    T5X_CASES,
    "tensorflow-text names `tensorflow`, so the T5X set installs tensorflow beside its pinned "
    "tensorflow-cpu (the same version; the second overwrites the first's files)",
)


def _params(known: dict[Case, str] | None = None, kind: str | None = None) -> list[Any]:
    """CASES (of one backend) as pytest params, those in ``known`` as strict xfails with its reason."""
    known = known or {}
    return [
        pytest.param(
            case,
            id=case.id,
            marks=[pytest.mark.xfail(strict=True, reason=known[case])] if case in known else [],
        )
        for case in CASES
        if kind in (None, case.kind)
    ]


@dataclass
class Resolution:
    case: Case
    returncode: int
    stderr: str
    seconds: float
    dropped: tuple[str, ...]
    installed: dict[str, dict[str, Any]]
    """Canonical name -> the report's ``install`` item (its ``metadata``: name, version, requires_dist)."""
    no_deps: dict[str, dict[str, Any]]
    """The spec's ``no_deps`` that are plain PyPI requirements, each resolved alone with ``--no-deps``."""

    def version(self, name: str) -> str | None:
        item = self.installed.get(canonicalize_name(name))
        return None if item is None else item["metadata"]["version"]

    def explain(self) -> str:
        return (
            f"{self.case.id}: pip exited {self.returncode} after {self.seconds:.0f} s:\n{self.stderr[-3000:]}"
        )


def _pip_args(case: Case, target: Path) -> list[str]:
    abi = "cp" + case.python.replace(".", "")
    return [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--isolated",
        "--disable-pip-version-check",
        "--no-input",
        "--quiet",
        "--dry-run",
        "--ignore-installed",
        "--only-binary=:all:",
        "--use-feature=fast-deps",
        "--target",
        str(target),
        "--python-version",
        case.python,
        "--implementation",
        "cp",
        "--abi",
        abi,
        *(arg for platform in PLATFORMS for arg in ("--platform", platform)),
    ]


def _offline(pip_args: tuple[str, ...]) -> tuple[list[str], tuple[str, ...]]:
    """(the spec's pip args without the indexes other than PyPI, what was dropped)."""
    kept: list[str] = []
    dropped: list[str] = []
    args = iter(pip_args)
    for arg in args:
        if arg in UNREACHABLE_OPTIONS:
            dropped.append(f"{arg} {next(args)}")
        elif arg.split("=", 1)[0] in UNREACHABLE_OPTIONS:
            dropped.append(arg)
        else:
            kept.append(arg)
    return kept, tuple(dropped)


def _report(argv: list[str], report: Path) -> tuple[int, str, dict[str, dict[str, Any]]]:
    try:
        proc = subprocess.run(
            [*argv, "--report", str(report)],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=PIP_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return 124, f"pip did not finish in {PIP_TIMEOUT_S} s", {}
    if proc.returncode:
        return proc.returncode, proc.stderr, {}
    items = json.loads(report.read_text())["install"]
    return 0, proc.stderr, {canonicalize_name(item["metadata"]["name"]): item for item in items}


def _spec(case: Case) -> EnvSpec:
    return get_backend(case.kind).env_spec(schema(case.kind).SECTION(), "tpu", "python3")


def _plain_no_deps(case: Case) -> tuple[str, ...]:
    """The spec's ``no_deps`` that PyPI can resolve (not a git URL nor a path)."""
    return tuple(entry for entry in _spec(case).no_deps if "@" not in entry and "/" not in entry)


def _resolve(case: Case, work: Path, wheelhouse: Future[Path] | None) -> Resolution:
    spec = _spec(case)
    extra, dropped = _offline(spec.pip_args)
    folder = work / case.id
    folder.mkdir()
    argv = _pip_args(case, folder / "target") + extra
    if wheelhouse is not None:
        argv += ["--find-links", str(wheelhouse.result())]
    started = time.monotonic()
    code, stderr, installed = _report([*argv, *spec.requirements], folder / "report.json")
    no_deps: dict[str, dict[str, Any]] = {}
    for index, entry in enumerate(_plain_no_deps(case)):
        more_code, more_err, found = _report([*argv, "--no-deps", entry], folder / f"no-deps-{index}.json")
        if more_code:
            code, stderr = more_code, f"{entry} (--no-deps): {more_err}"
        no_deps.update(found)
    return Resolution(case, code, stderr, time.monotonic() - started, dropped, installed, no_deps)


def _build_wheelhouse(folder: Path) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--isolated",
            "--disable-pip-version-check",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--wheel-dir",
            str(folder),
            *SDIST_ONLY,
        ],
        check=True,
        stdin=subprocess.DEVNULL,
        timeout=PIP_TIMEOUT_S,
    )
    return folder


def _index_reachable() -> str | None:
    """None when PyPI answers within a few seconds, else why not."""
    try:
        with urllib.request.urlopen(INDEX, timeout=5) as response:
            response.read(1)
    except OSError as exc:
        return f"{INDEX} is not reachable ({exc})"
    return None


@pytest.fixture(scope="module")
def resolutions(tmp_path_factory: pytest.TempPathFactory) -> dict[Case, Resolution]:
    why = _index_reachable()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the TPU install sets need the package index under CI: {why}")
        pytest.skip(f"the TPU install sets need the package index: {why}")
    pip = version("pip")
    if int(pip.split(".")[0]) < PIP_MAJOR:
        pytest.fail(f"pip {pip} downloads every wheel of a dry run; pip >= {PIP_MAJOR} is in the test extra")
    work = tmp_path_factory.mktemp("tpu-sets")
    cases = (*CASES, BELOW_FLOOR, PAST_CEILING)
    with ThreadPoolExecutor(len(cases) + 1) as pool:
        wheels = pool.submit(_build_wheelhouse, work / "wheelhouse")
        futures = {
            case: pool.submit(_resolve, case, work, wheels if case.kind == "t5x" else None) for case in cases
        }
        return {case: future.result() for case, future in futures.items()}


@pytest.mark.parametrize("case", _params(DOES_NOT_RESOLVE))
def test_the_tpu_set_co_installs(resolutions: dict[Case, Resolution], case: Case) -> None:
    resolution = resolutions[case]
    assert resolution.returncode == 0, resolution.explain()
    print(
        f"{case.id}: {len(resolution.installed)} wheels in {resolution.seconds:.1f} s; not checked: "
        f"{', '.join(resolution.dropped) or 'nothing'}"
    )


def test_t5x_needs_its_min_python(resolutions: dict[Case, Resolution]) -> None:
    resolution = resolutions[BELOW_FLOOR]
    assert resolution.returncode != 0, (
        f"the T5X set resolves on Python {BELOW_FLOOR.python}: MIN_PYTHON can go down"
    )
    assert "No matching distribution found for jax" in resolution.stderr, resolution.explain()


def test_t5x_stops_at_its_max_python(resolutions: dict[Case, Resolution]) -> None:
    resolution = resolutions[PAST_CEILING]
    assert resolution.returncode != 0, (
        f"the T5X set resolves on Python {PAST_CEILING.python}: MAX_PYTHON can go up"
    )
    assert "editdistance" in resolution.stderr, resolution.explain()


@pytest.mark.parametrize("case", _params(kind="t5x"))
def test_t5x_gets_the_libtpu_of_its_jax(resolutions: dict[Case, Resolution], case: Case) -> None:
    """The libtpu a worker installs is the one ``recipes show --compile`` compiles with
    (tpuft/backends/t5x_compile.py)."""
    resolution = _resolved(resolutions, case)
    assert (resolution.version("jax"), resolution.version("jaxlib")) == (JAX_VERSION, JAX_VERSION)
    assert resolution.version("libtpu") == LIBTPU_FOR_JAX[JAX_VERSION]


def test_torch_xla_gets_its_torch_and_libtpu(resolutions: dict[Case, Resolution]) -> None:
    resolution = _resolved(resolutions, Case("torch_xla", IMAGE_PYTHON))
    version = schema("torch_xla").SECTION().torch_version
    assert (resolution.version("torch"), resolution.version("torch-xla")) == (version, version)
    pinned = _required_by(resolution, "torch-xla", "libtpu", extra="tpu")
    assert pinned is not None and resolution.version("libtpu") in pinned.specifier, pinned


def test_keras_gets_tensorflow_tpu_and_a_libtpu_it_accepts(resolutions: dict[Case, Resolution]) -> None:
    resolution = _resolved(resolutions, Case("keras", IMAGE_PYTHON))
    assert resolution.version("tensorflow-tpu") == TF_VERSION
    wanted = _required_by(resolution, "tensorflow-tpu", "libtpu")
    assert wanted is not None and resolution.version("libtpu") in wanted.specifier, wanted


@pytest.mark.parametrize("case", [case for case in _params() if _plain_no_deps(case.values[0])])
def test_no_deps_packages_find_what_they_need(resolutions: dict[Case, Resolution], case: Case) -> None:
    """A package installed with ``--no-deps`` (tf-keras) still needs its requirements: each must be in the set
    at a version it accepts (``tensorflow`` is any of TF's wheels)."""
    resolution = _resolved(resolutions, case)
    environment = _environment(case.python)
    for name, item in resolution.no_deps.items():
        for text in item["metadata"].get("requires_dist", []):
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate(environment):
                continue
            names = (
                TENSORFLOW_WHEELS
                if canonicalize_name(requirement.name) == "tensorflow"
                else (requirement.name,)
            )
            found = [(other, v) for other in names if (v := resolution.version(other)) is not None]
            assert found, f"{name} needs {requirement}, which the set does not install"
            assert all(v in requirement.specifier for _, v in found), (
                f"{name} needs {requirement}; the set has {found}"
            )


@pytest.mark.parametrize("case", _params(CUDA_TORCH))
def test_no_cuda_wheels_on_a_tpu_host(resolutions: dict[Case, Resolution], case: Case) -> None:
    resolution = _resolved(resolutions, case)
    cuda = sorted(name for name in resolution.installed if name.startswith("nvidia-") or "cuda" in name)
    assert not cuda, f"{case.id} installs {len(cuda)} CUDA wheels: {', '.join(cuda)}"
    assert not re.search(r"\+cu\d", resolution.version("torch") or ""), (
        f"{case.id} installs a CUDA build of torch"
    )


@pytest.mark.parametrize("case", _params(TWO_TENSORFLOWS))
def test_one_tensorflow_at_most(resolutions: dict[Case, Resolution], case: Case) -> None:
    resolution = _resolved(resolutions, case)
    found = [name for name in TENSORFLOW_WHEELS if resolution.version(name) is not None]
    assert len(found) <= 1, f"{case.id} installs {found}"


def _resolved(resolutions: dict[Case, Resolution], case: Case) -> Resolution:
    """The case's resolution; a set that does not resolve fails test_the_tpu_set_co_installs, not every test
    here."""
    resolution = resolutions[case]
    if resolution.returncode:
        pytest.skip(f"{case.id} does not resolve (test_the_tpu_set_co_installs says why)")
    return resolution


def _required_by(resolution: Resolution, package: str, name: str, extra: str = "") -> Requirement | None:
    environment = {**_environment(resolution.case.python), "extra": extra}
    for text in resolution.installed[canonicalize_name(package)]["metadata"].get("requires_dist", []):
        requirement = Requirement(text)
        if canonicalize_name(requirement.name) == canonicalize_name(name) and (
            requirement.marker is None or requirement.marker.evaluate(environment)
        ):
            return requirement
    return None


def _environment(python: str) -> dict[str, str]:
    """The markers' view of a TPU VM with this Python (not this machine's)."""
    return {
        **default_environment(),
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "extra": "",
    }
