"""Build (or reuse) a backend venv on a worker. Runs with the host's own python3 before any venv exists, so it is
stdlib-only and runnable as a plain script: ``python3 bootstrap.py --spec '{"key": ..., "requirements": [...]}'``.

Venvs are cached by a hash of their requirements (the key), so a second ``tpuft setup`` takes seconds. Workers that
share a disk (the local pod) share the cache: a file lock makes one build while the others wait, and a marker file
written last tells a complete venv from one whose build was interrupted (which is then rebuilt).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

MARKER = ".tpuft-complete"
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
"""This script runs under the interpreter the venv is built from, so this is the venv's Python version."""


def is_ready(venv: Path) -> bool:
    """Complete, and built by this Python (an upgraded python3 on the host makes the cached venv stale)."""
    try:
        record = json.loads((venv / MARKER).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    return record.get("python") == PYTHON


def _say(message: str) -> None:
    print(f"[setup] {message}", flush=True)


def _run(argv: list[str]) -> None:
    _say("$ " + " ".join(argv))
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"[setup] command failed with exit code {proc.returncode}: {' '.join(argv)}")


def ensure_venv(cache: Path, spec: dict) -> Path:
    venv = cache / spec["key"]
    if is_ready(venv):
        _say(f"venv ready (cached): {venv}")
        return venv
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{spec['key']}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say("another worker is building this venv; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if is_ready(venv):
            _say(f"venv ready (built by another worker): {venv}")
            return venv
        if venv.exists():
            _say(f"removing an incomplete or stale venv: {venv}")
            shutil.rmtree(venv)
        started = time.time()
        _run([spec.get("python") or sys.executable, "-m", "venv", str(venv)])
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off"]
        _run([*pip, *spec.get("pip_args", []), *spec["requirements"]])
        seconds = round(time.time() - started, 1)
        record = {"requirements": spec["requirements"], "python": PYTHON, "built_at": time.time(), "seconds": seconds}
        (venv / MARKER).write_text(json.dumps(record, indent=2))
        _say(f"venv built in {seconds}s: {venv}")
        return venv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache", required=True, help="folder holding cached venvs")
    parser.add_argument("--spec", required=True, help="JSON: key, requirements, python, pip_args")
    parser.add_argument("--check", action="store_true", help="only report whether the venv is ready (exit 3 if not)")
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
