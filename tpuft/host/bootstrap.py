"""Build (or reuse) a backend venv on a worker. Runs with the host's own python3 before any venv exists, so it
is stdlib-only and runnable as a plain script: ``python3 bootstrap.py --spec '{"key": ..., "requirements":
[...]}'``.

Venvs are cached by a hash of their requirements (the key), so a second ``tpuft setup`` takes seconds. Workers
that share a disk (the local pod) share the cache: a file lock makes one build while the others wait, and a
marker file written last tells a complete venv from one whose build was interrupted (which is then rebuilt).

``no_deps`` entries are installed after the requirements with ``--no-deps`` (packages whose own dependency
lists cannot be trusted); an entry starting with ``~/`` is a copy that tpuft shipped under this worker's HOME.
When the pins need a newer Python than the one running this script (``min_python``), the venv is built from
the newest ``python3.N`` on PATH that is new enough.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MARKER = ".tpuft-complete"
WAIT_REPORT_S = float(os.environ.get("TPUFT_WAIT_EVERY_S", "30"))
"""While another process builds the venv: how often to say that this one still waits (tpuft.core.waiting's
cadence)."""
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
"""The Python running this script: the worker's base interpreter, which the venv is built from unless
``min_python`` asks for a newer one."""
NEWEST_MINOR = 20
"""Looking for an interpreter new enough starts at python3.<this> (or at min_python's minor, when higher)."""
_VERSION_PROBE = "import sys; print('%d.%d' % sys.version_info[:2])"


def lock_path(cache: Path, key: str) -> Path:
    """The venv's build lock: held (``flock``, exclusive) by the one process building it, and naming it (pid,
    host, start time) so that a waiting setup and ``tpuft doctor`` can say who builds."""
    return cache / f"{key}.lock"


def is_ready(venv: Path) -> bool:
    """Complete, and built while this base Python was the one running the bootstrap (an upgraded python3 on
    the host makes the cached venv stale). A venv built from a newer interpreter found on PATH records both
    versions."""
    try:
        record = json.loads((venv / MARKER).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    return record.get("base_python", record.get("python")) == PYTHON


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _probe(command: str) -> str | None:
    """``major.minor`` of the interpreter ``command`` names on PATH, or None if there is none that runs (a
    pyenv shim for a version that is not installed exists on PATH and fails)."""
    path = shutil.which(command)
    if path is None:
        return None
    try:
        proc = subprocess.run([path, "-c", _VERSION_PROBE], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = proc.stdout.strip()
    return found if proc.returncode == 0 and re.fullmatch(r"\d+\.\d+", found) else None


def pick_python(spec: dict) -> tuple[str, str]:
    """(interpreter to build the venv from, its ``major.minor``): the spec's own when it is within
    ``min_python`` .. ``max_python``, else the newest ``python3.N`` on PATH that is; exits with what to do
    when there is none. The ceiling exists because a pin can stop at a Python (T5X's seqio needs editdistance,
    which has no wheel past 3.12): a worker whose newest interpreter is past it would build from source and
    fail without a compiler."""
    base = spec.get("python") or sys.executable
    needed, ceiling = spec.get("min_python"), spec.get("max_python")
    if _within(PYTHON, needed, ceiling):
        return base, PYTHON
    major, minor = _version(needed or PYTHON)[:2]
    top = _version(ceiling)[1] if ceiling else max(NEWEST_MINOR, minor)
    for candidate in range(top, minor - 1, -1):
        command = f"python{major}.{candidate}"
        found = _probe(command)
        if found is not None and _within(found, needed, ceiling):
            _say(
                f"{spec.get('kind', 'this')} venv needs Python {_span(needed, ceiling)} and {base} is "
                f"{PYTHON}: using {command} ({found})"
            )
            return str(shutil.which(command)), found
    wanted = f"python{major}.{top}" if ceiling else f"python{major}.{minor}"
    where = (
        f"no python{major}.{minor} .. python{major}.{top} on PATH"
        if ceiling
        else f"no python{major}.{minor} or newer on PATH"
    )
    raise SystemExit(
        f"[setup] the {spec.get('kind', spec['key'])} venv needs Python {_span(needed, ceiling)} (its "
        f"pinned wheels do), but this worker's {base} is Python {PYTHON} and there is {where}: install one "
        f"with its venv module on the workers (e.g. apt-get install {wanted} {wanted}-venv), or "
        "set gcp.python in the cluster file to an interpreter that fits"
    )


def _within(version: str, lowest: str | None, highest: str | None) -> bool:
    """Whether ``major.minor`` lies in [lowest, highest] (either bound may be absent; the ceiling counts
    minors)."""
    have = _version(version)[:2]
    return (not lowest or have >= _version(lowest)[:2]) and (not highest or have <= _version(highest)[:2])


def _span(lowest: str | None, highest: str | None) -> str:
    if lowest and highest:
        return f">= {lowest} and <= {highest}"
    return f">= {lowest}" if lowest else f"<= {highest}"


def _say(message: str) -> None:
    print(f"[setup] {message}", flush=True)


def _run(argv: list[str], hint: str = "") -> None:
    _say("$ " + " ".join(argv))
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"[setup] command failed with exit code {proc.returncode}: {' '.join(argv)}{hint}")


def _try_lock(handle: Any) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _wait_for_builder(lock: Any, venv: Path) -> None:
    """Another tpuft process (a worker sharing this disk, or a second setup) builds this venv: say so at once
    and every ``WAIT_REPORT_S`` seconds while waiting, naming it, so a long pip install is never a silent
    hang."""
    builder = lock.read().strip() or "a process that did not say"
    _say(f"another tpuft process is building this venv ({builder}); waiting for it: {venv}")
    started = last = time.monotonic()
    while not _try_lock(lock):
        time.sleep(0.2)
        if time.monotonic() - last >= WAIT_REPORT_S:
            last = time.monotonic()
            _say(
                f"still waiting for the venv build by {builder} ({time.monotonic() - started:.0f} s so far; "
                "it ends when that pip install does)"
            )
    if time.monotonic() - started >= 2:
        _say(f"the other build ended after {time.monotonic() - started:.0f} s of waiting")


@contextmanager
def build_lock(cache: Path, key: str) -> Iterator[None]:
    """Hold the venv's build lock for the ``with`` block (waiting, and saying so, while another process holds
    it), with this process named in the lock file for whoever asks who builds."""
    cache.mkdir(parents=True, exist_ok=True)
    # not "w": it names the builder
    fd = os.open(lock_path(cache, key), os.O_RDWR | os.O_CREAT, 0o644)
    with os.fdopen(fd, "r+") as lock:
        if not _try_lock(lock):
            _wait_for_builder(lock, cache / key)
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%H:%M:%S')}\n")
        lock.flush()
        yield


def ensure_venv(cache: Path, spec: dict) -> Path:
    venv = cache / spec["key"]
    if is_ready(venv):
        _say(f"venv ready (cached): {venv}")
        return venv
    with build_lock(cache, spec["key"]):
        if is_ready(venv):
            _say(f"venv ready (built by another worker): {venv}")
            return venv
        if venv.exists():
            _say(f"removing an incomplete or stale venv: {venv}")
            shutil.rmtree(venv)
        started = time.time()
        python, version = pick_python(spec)
        hint = (
            ""
            if version == PYTHON
            else f" (does {python} have its venv module? e.g. apt-get install python{version}-venv)"
        )
        _run([python, "-m", "venv", str(venv)], hint)
        pip = [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
        ]
        _run([*pip, *spec.get("pip_args", []), *spec["requirements"]])
        no_deps = [
            os.path.expanduser(entry) if entry.startswith("~/") else entry
            for entry in spec.get("no_deps", [])
        ]
        if no_deps:
            _run([*pip, *spec.get("pip_args", []), "--no-deps", *no_deps])
        seconds = round(time.time() - started, 1)
        record = {
            "requirements": spec["requirements"],
            "no_deps": no_deps,
            "python": version,
            "base_python": PYTHON,
            "interpreter": python,
            "built_at": time.time(),
            "seconds": seconds,
        }
        (venv / MARKER).write_text(json.dumps(record, indent=2))
        _say(f"venv built in {seconds}s: {venv}")
        return venv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache", required=True, help="folder holding cached venvs")
    parser.add_argument(
        "--spec",
        required=True,
        help="JSON: key, requirements, python, pip_args, no_deps, min_python, max_python (EnvSpec.payload)",
    )
    parser.add_argument(
        "--check", action="store_true", help="only report whether the venv is ready (exit 3 if not)"
    )
    args = parser.parse_args(argv)
    spec = json.loads(args.spec)
    cache = Path(os.path.expanduser(args.cache))
    if args.check:
        ready = is_ready(cache / spec["key"])
        print(f"[setup] {'ready' if ready else 'missing'}: {cache / spec['key']}", flush=True)
        return 0 if ready else 3
    ensure_venv(cache, spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
