"""The trainer's persistent compilation cache (``train.compile_cache``): the compiled XLA programs kept on the
host's disk, so that a trainer started again on the same host (``tpuft resume``, a hung or crashed trainer
restarted by its supervisor, a run relaunched after its controller was killed) loads its train and eval steps
instead of compiling them again. On a TPU a large model's first compile takes minutes of every restart, and a
week on spot capacity restarts many times; on the local pod it is most of a small run's start-up.

Each engine in its own way, both keyed by the program, the compiler's version and its flags, so a changed
model or a new jax/torch_xla compiles afresh and never loads a stale program:
- JAX (t5x): ``jax_compilation_cache_dir``. Every process of the run reads the one folder; JAX writes from
  process 0 alone, which the local pod's workers share (one machine).
- torch_xla: ``torch_xla.runtime.initialize_cache``, one folder per process (torch_xla's rule: processes
  must not write one folder together).

What it holds is only a cache: a failure to open it is said and the run compiles as before."""

from __future__ import annotations

import os
from pathlib import Path

from tpuft.backends.spec import COMPILE_CACHE_ENV

MAX_BYTES = 8 << 30
"""JAX's cache is trimmed to this, least recently used first: a TPU VM's boot disk holds it many times
over, and a few models' programs fit (a large T5's train step is tens of MB)."""


def cache_folder(*parts: str) -> Path | None:
    """The folder this process keeps its programs in (``parts`` below the launch plan's), made if new; None
    when the recipe turned the cache off or the folder cannot be made (said once, and the run goes on)."""
    raw = os.environ.get(COMPILE_CACHE_ENV, "").strip()
    if not raw:
        return None
    folder = Path(raw).expanduser().joinpath(*parts)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"[tpuft] compile cache off: cannot make {folder}: {exc}", flush=True)
        return None
    return folder


def programs(folder: Path) -> int:
    """How many compiled programs the folder holds (JAX's ``*-cache`` files, torch_xla's hashed files)."""
    return sum(1 for entry in folder.iterdir() if entry.is_file() and not entry.name.startswith("."))


def announce(folder: Path) -> None:
    """The chief's line on what the cache holds as the run starts (a user sees whether a restart loads its
    programs)."""
    found = programs(folder)
    held = (
        f"{found} program(s) kept from earlier runs"
        if found
        else "empty, this run's programs are kept for the next"
    )
    print(f"[tpuft] compile cache {folder}: {held}", flush=True)


def start_jax_cache(chief: bool = False) -> Path | None:
    """Point JAX's persistent compilation cache at the plan's folder, before the first compile. Every
    program that took over a second to compile is kept (JAX's own threshold), the small ones are cheaper
    to compile than to read. The ``chief`` says what the folder holds."""
    folder = cache_folder()
    if folder is None:
        return None
    if chief:
        announce(folder)
    import jax

    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    return folder


def start_torch_xla_cache(worker: int, process: int = 0) -> Path | None:
    """torch_xla's persistent cache in this process's own folder (``worker-W`` or ``worker-W-P`` for the
    P-th process of a TPU host), before the runtime's first computation; worker 0's first process says what
    it holds."""
    folder = cache_folder(f"worker-{worker}" + (f"-{process}" if process else ""))
    if folder is None:
        return None
    import torch_xla
    import torch_xla.runtime as xr

    if torch_xla._XLAC._xla_computation_cache_is_initialized():
        # too late for this process: a second trainer in it (a test harness) has the first one's cache, if any
        current = os.environ.get("XLA_PERSISTENT_CACHE_PATH")
        return Path(current) if current else None
    xr.initialize_cache(str(folder), readonly=False)
    if worker == 0 and process == 0:
        announce(folder)
    return folder
