"""Shared fixtures. Every test runs with its own TPUFT_HOME and never touches ~/.tpuft; backend venvs are
shared through the machine-wide cache (~/.cache/tpuft/venvs), as they are for users."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytest_plugins = ["tests.cpu_log"]


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """The slow modules (backend venvs, trainings) the longest first and the quick ones, a module kept whole
    (tests/lanes.py: in lanes the slow modules first, in their own lane; in one process the quick ones first);
    the venvs the slow ones need are built in the background meanwhile. Without T5X sources (a clone of the
    repository alone) the tests that need the T5X venv are skipped, with how to get them."""
    from tests.lanes import lay_out
    from tests.venvs import t5x_source, wanted

    missing = t5x_source()[1]
    if missing:
        for item in items:
            if "t5x" in wanted([item]):
                item.add_marker(pytest.mark.skip(reason=missing))
    lay_out(items)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadfile`` (pyproject.toml's addopts): the slow modules in one lane, the quick ones and then
    the side ones in the other (tests/lanes.py); any other ``--dist`` is xdist's own."""
    if config.getoption("dist") != "loadfile":
        return None
    from tests.lanes import SlowLaneScheduling

    return SlowLaneScheduling(config, log)


_venv_builder: list[tuple[subprocess.Popen[bytes], Path]] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    from tests.venvs import prebuild, wanted

    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return  # one build for every lane: the first lane's (each lane collects the whole suite)
    slow = [item for item in session.items if item.get_closest_marker("slow") is not None]
    if slow and len(slow) < len(session.items):  # only when quick tests can run beside the build
        cache = getattr(session.config, "cache", None)
        log = (
            cache.mkdir("tpuft-venvs") if cache is not None else Path(tempfile.gettempdir())
        ) / "venv-prebuild.log"
        child = prebuild(wanted(slow), log)
        if child is not None:
            _venv_builder.append((child, log))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A session that ends first (``-x``, Ctrl-C) stops the build: an unfinished venv is rebuilt next time."""
    for child, _ in _venv_builder:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)  # pip included
            child.wait(timeout=30)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for child, log in _venv_builder:
        if child.returncode:
            terminalreporter.write_line(
                f"backend venvs: the background build failed or was stopped; its log: {log}"
            )


@dataclass
class CliResult:
    code: int
    out: str
    err: str


def run_cli(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> CliResult:
    """Run ``tpuft ARGS`` in-process through the real entry point (error handling and exit codes included)."""
    from tpuft.cli import main

    monkeypatch.setattr(sys, "argv", ["tpuft", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    captured = capsys.readouterr()
    return CliResult(code, captured.out, captured.err)


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):  # type: ignore[no-untyped-def]
    """The first truthy value of ``predicate()`` within ``timeout`` seconds (runs are detached: tests poll
    them)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for_files(paths: list[Path], timeout: float = 15.0) -> None:
    """Until every file of ``paths`` exists with some text in it (a worker wrote it), at most ``timeout``
    s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(p.exists() and p.read_text().strip() for p in paths):
            return
        time.sleep(0.05)
    raise AssertionError(f"not written in time: {[str(p) for p in paths if not p.exists()]}")


def default_sigint() -> None:
    """``preexec_fn`` for a child that a test sends Ctrl-C (SIGINT): a shell that started pytest in the
    background (``pytest &`` in a script, some CI runners) hands SIGINT down as *ignored*, and a Python
    started that way never turns SIGINT into KeyboardInterrupt. The test sets the disposition it relies on
    instead of inheriting one."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    """In-process: SIGINT raises KeyboardInterrupt in the main thread, however pytest itself was started."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture(autouse=True)
def _isolated_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("tpuft-home")
    monkeypatch.setenv("TPUFT_HOME", str(home))
    monkeypatch.delenv("TPUFT_CONFIG", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    # no background connection agents; tests/ops/test_agent.py turns them on
    monkeypatch.setenv("TPUFT_NO_AGENT", "1")
    for forced in ("FORCE_COLOR", "TTY_COMPATIBLE"):  # tests read plain text
        monkeypatch.delenv(forced, raising=False)
    yield home
    from tests.rigs.sshd_pod import kill_processes_with_home_under

    # runs are detached by design: a test's local workers must not outlive it
    kill_processes_with_home_under(home)


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    return lambda *args: run_cli(list(args), monkeypatch, capsys)


MINIMAL_RECIPE = """\
name: t
backend:
  kind: torch_xla
model:
  config: {d_model: 8}
data:
  train: train.jsonl
train:
  steps: 10
  batch_size: 4
"""
"""The smallest valid recipe (10 lines): tests change one line of it and check where the error points."""


@pytest.fixture
def recipe_dir(tmp_path: Path) -> Path:
    """A folder with a one-example train.jsonl, for recipes whose data is `train.jsonl`."""
    (tmp_path / "train.jsonl").write_text('{"source": "a", "target": "b"}\n')
    return tmp_path


@pytest.fixture
def cluster_file(tmp_path: Path) -> Path:
    """A 2-worker local cluster file in a temp dir; one device per worker (the device-layout tests ask for
    more)."""
    path = tmp_path / "tpuft.yaml"
    path.write_text(
        "name: test-pod\nprovider: local\naccelerator: v4-16\nlocal:\n  workers: 2\n  devices_per_worker: 1\n"
    )
    return path


@pytest.fixture(scope="session")
def torch_python() -> str:
    """Python of the PyTorch/XLA backend venv (torch + transformers 5), built once per machine and cached."""
    from tests.venvs import torch_python as build

    return build()


@pytest.fixture(scope="session")
def t5x_python() -> str:
    """Python of the T5X backend's CPU venv (jax, flax, seqio, TF, t5x from ../shared/wheels or
    TPUFT_T5X_SOURCE: ``tests.venvs.t5x_source``), built once per machine."""
    from tests.venvs import t5x_python as build

    return build()


@pytest.fixture(scope="session")
def keras_python() -> str:
    """Python of a venv with TensorFlow + transformers 4.x, built once per machine through tpuft's venv
    cache."""
    from tests.venvs import keras_python as build

    return build()


@pytest.fixture(scope="module")
def gcs() -> Iterator[object]:
    """One GCS emulator per test module; STORAGE_EMULATOR_HOST points the real google-cloud-storage client at
    it until the module ends (tests/rigs/gcs_emulator.py)."""
    from tests.rigs.gcs_emulator import GcsEmulator

    with GcsEmulator() as emulator, pytest.MonkeyPatch.context() as env:
        for key, value in emulator.env().items():
            env.setenv(key, value)
        env.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
        yield emulator
