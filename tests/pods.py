"""A 2-worker local pod driven through the real CLI, for the backends' end-to-end tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Pod:
    env: dict[str, str]
    cluster: Path
    runs: Path

    def tpuft(self, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tpuft", *args, "-c", str(self.cluster)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def up(self, recipe: str, *settings: str) -> Finished:
        """``tpuft up RECIPE --json``: it must succeed; its summary, run dir and wall time."""
        started = time.monotonic()
        done = self.tpuft("up", recipe, "--json", *settings)
        seconds = time.monotonic() - started
        assert done.returncode == 0, done.stderr[-6000:]
        summary = json.loads(done.stdout)
        print(f"\n{recipe}: {seconds:.0f} s end to end, last eval {summary['last_eval']}")
        return Finished(summary, Path(summary["run_dir"]), seconds)


@dataclass
class Finished:
    summary: dict[str, Any]
    run_dir: Path
    seconds: float


def created_pod(home: Path, name: str) -> Pod:
    """A created 2-worker local pod named ``name`` whose TPUFT_HOME is under ``home``; one device per worker,
    the fast rehearsal (a test about the device layout writes its own cluster file for the same pod)."""
    cluster = home / "tpuft.yaml"
    cluster.write_text(
        f"name: {name}\nprovider: local\naccelerator: v4-16\nlocal:\n  workers: 2\n  devices_per_worker: 1\n"
    )
    env = {**os.environ, "TPUFT_HOME": str(home / "tpuft-home"), "COLUMNS": "200"}
    pod = Pod(env, cluster, home / "tpuft-home" / "buckets" / name / "runs")
    created = pod.tpuft("create")
    assert created.returncode == 0, created.stderr[-3000:]
    return pod
