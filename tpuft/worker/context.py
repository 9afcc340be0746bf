"""What a worker process knows about its place in the run, from the environment the launcher sets."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tpuft.core.records import SliceLayout


@dataclass(frozen=True)
class WorkerContext:
    run_id: str
    run_dir: Path
    """Where this worker writes run files: the run dir itself, or a local staging copy of a gs:// one."""
    worker_id: int
    num_workers: int
    coordinator: str
    """``host:port`` of worker 0, for rendezvous on backends that need one."""
    run_url: str = ""
    """The run dir as the launcher named it (``gs://...`` when it is remote, else the same as ``run_dir``)."""
    num_slices: int = 1
    """Multislice (``TPUFT_NUM_SLICES``): the launched workers are this many equal slices, numbered slice by
    slice."""

    @property
    def layout(self) -> SliceLayout:
        return SliceLayout(self.num_slices, max(1, self.num_workers // self.num_slices))

    @property
    def slice_id(self) -> int:
        return self.layout.slice_of(self.worker_id)

    @property
    def remote(self) -> bool:
        return self.run_url.startswith("gs://")

    @property
    def chief(self) -> bool:
        return self.worker_id == 0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> WorkerContext:
        env = dict(os.environ if env is None else env)
        missing = [
            k
            for k in ("TPUFT_RUN_ID", "TPUFT_RUN_DIR", "TPUFT_WORKER_ID", "TPUFT_NUM_WORKERS")
            if k not in env
        ]
        if missing:
            raise SystemExit(f"tpuft.worker: missing environment {', '.join(missing)} (set by `tpuft train`)")
        url = env["TPUFT_RUN_DIR"]
        local = Path(url)
        if url.startswith("gs://"):  # objects cannot be appended to: write locally, mirror to the bucket
            local = Path(env.get("HOME", "~")).expanduser() / ".tpuft" / "runs" / env["TPUFT_RUN_ID"]
        return cls(
            run_id=env["TPUFT_RUN_ID"],
            run_dir=local,
            worker_id=int(env["TPUFT_WORKER_ID"]),
            num_workers=int(env["TPUFT_NUM_WORKERS"]),
            coordinator=env.get("TPUFT_COORDINATOR", "127.0.0.1:8476"),
            run_url=url,
            num_slices=int(env.get("TPUFT_NUM_SLICES", "1")),
        )


def pin_cpus() -> None:
    """Local workers are given disjoint cores (``TPUFT_CPUS``), like TPU hosts that do not share CPUs."""
    cpus = os.environ.get("TPUFT_CPUS")
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
