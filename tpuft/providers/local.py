"""The local provider: a "pod" of N worker folders on this machine, each a private HOME.

It runs the real backend on CPU, so a recipe can be rehearsed (and CI can test the whole path) without a cloud
account. Workers are pinned to disjoint CPU cores where the machine has enough, as real TPU hosts do not share
CPUs.

``local.slices`` rehearses Multislice: ``slices x local.workers`` folders, numbered slice by slice as a queued
resource's workers are (``worker-5`` is slice 1 host 1 of 4 hosts per slice), each :class:`Worker` with its
slice. A local "slice" is only a group of worker processes: there is no data-centre network between them.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from tpuft.config import ClusterConfig
from tpuft.core.errors import UsageError
from tpuft.core.paths import tpuft_home, venv_cache
from tpuft.core.records import Cluster, Progress, State, Worker
from tpuft.fleet.local import LocalFleet
from tpuft.run.maintenance_window import notice_details

_MARKER = "cluster.json"


class LocalProvider:
    name = "local"
    target = "cpu"

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self._state_dir = (
            (config.local.state_dir or tpuft_home() / "local" / config.name).expanduser().resolve()
        )

    # -- locations ------------------------------------------------------------------------------------------
    def state_dir(self) -> Path:
        return self._state_dir

    def bucket(self) -> Path:
        if self.config.bucket:  # a local path: the cluster file's check refuses gs:// for this provider
            return Path(self.config.bucket).expanduser().resolve()
        return tpuft_home() / "buckets" / self.config.name

    def storage_url(self) -> str:
        return str(self.bucket())

    def venv_cache(self) -> str:
        return str((self.config.local.venv_cache or venv_cache()).expanduser().resolve())

    def python(self) -> str:
        return self.config.local.python

    def _worker_dir(self, index: int) -> Path:
        return self._state_dir / "workers" / f"worker-{index}"

    def plan(self) -> dict[str, Any]:
        """What ``create`` would make (``--dry-run``): one folder per worker, each its HOME, and the run
        storage."""
        return {
            "state_dir": str(self._state_dir),
            "worker_folders": [str(self._worker_dir(index)) for index in range(self.config.num_workers)],
            **({"slices": self.config.slices} if self.config.slices > 1 else {}),
            "bucket": self.storage_url(),
            "venv_cache": self.venv_cache(),
        }

    # -- verbs ----------------------------------------------------------------------------------------------
    def create(self, progress: Progress | None = None) -> tuple[Cluster, bool]:
        existing = self.get()
        wanted, slices = self.config.num_workers, self.config.slices
        if existing.state != State.NOT_FOUND:
            recorded = self._read_marker()
            shape = (recorded.get("workers"), int(recorded.get("slices", 1)))
            if shape == (wanted, slices) and existing.state == State.READY:
                _make_folder(self.bucket())
                return existing, False
            if shape != (wanted, slices):
                raise UsageError(
                    f"local cluster {self.config.name!r} exists with {_shape_text(*shape)}, "
                    f"the cluster file asks for {_shape_text(wanted, slices)}",
                    hint="Delete it first (tpuft delete --yes) or set local.workers"
                    f"{' and local.slices' if slices > 1 or shape[1] > 1 else ''} to match.",
                )
        if progress:
            progress(f"creating {_shape_text(wanted, slices)} (worker folders) under {self._state_dir}")
        marker = {
            "name": self.config.name,
            "accelerator": self.config.accelerator,
            "workers": wanted,
            "slices": slices,
            "created": time.time(),
        }
        for folder in [self._worker_dir(index) for index in range(wanted)] + [self.bucket()]:
            _make_folder(folder)
        try:
            (self._state_dir / _MARKER).write_text(json.dumps(marker, indent=2))
        except OSError as exc:
            raise UsageError(f"cannot write {self._state_dir / _MARKER}: {exc.strerror or exc}") from None
        return self.get(), True

    def get(self) -> Cluster:
        marker = self._read_marker()
        if not marker:
            return Cluster(
                name=self.config.name,
                provider=self.name,
                state=State.NOT_FOUND,
                accelerator=self.config.accelerator,
                bucket=str(self.bucket()),
            )
        count = int(marker.get("workers", 0))
        per_slice = max(1, count // max(1, int(marker.get("slices", 1))))
        workers = [
            Worker(
                index=i,
                address="localhost",
                home=self._worker_dir(i),
                cpus=_cpus_for(i, count),
                slice=i // per_slice,
            )
            for i in range(count)
        ]
        missing = [w.index for w in workers if w.home is None or not w.home.is_dir()]
        details = {"state_dir": str(self._state_dir), "venv_cache": self.venv_cache()}
        if missing:
            details["problem"] = f"worker folder(s) missing: {', '.join(map(str, missing))}"
        # tpuft drill maintenance's notices
        details.update(notice_details({w.index: w.home for w in workers}))
        return Cluster(
            name=self.config.name,
            provider=self.name,
            state=State.BROKEN if missing else State.READY,
            accelerator=str(marker.get("accelerator", self.config.accelerator)),
            workers=workers,
            bucket=str(self.bucket()),
            details=details,
        )

    def delete(self, progress: Progress | None = None) -> bool:
        if not self._state_dir.exists():
            return False
        if progress:
            progress(f"removing {self._state_dir}")
        shutil.rmtree(self._state_dir)
        return True

    def prepare(self, cluster: Cluster) -> None:
        """Local workers need no keys or addresses: nothing to do."""

    def fleet(self, cluster: Cluster) -> LocalFleet:
        return LocalFleet(cluster.workers)

    def _read_marker(self) -> dict:
        try:
            return json.loads((self._state_dir / _MARKER).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}


def _shape_text(workers: Any, slices: int) -> str:
    """``2 workers``, or ``4 workers (2 slices of 2)``: what a local cluster's marker and cluster file ask
    for."""
    return (
        f"{workers} workers"
        if slices == 1
        else f"{workers} workers ({slices} slices of {int(workers) // slices})"
    )


def _make_folder(path: Path) -> None:
    """A folder the cluster needs; a file in the way or a read-only disk is the user's to fix, named as
    such."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(
            f"cannot create folder {path}: a file of that name (or above it) is in the way"
        ) from None
    except OSError as exc:
        raise UsageError(f"cannot create folder {path}: {exc.strerror or exc}") from None


def _cpus_for(index: int, count: int) -> tuple[int, ...]:
    """Split this machine's cores evenly between the workers; when there are fewer cores than workers they
    share."""
    try:
        available = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return ()
    if count <= 1 or len(available) < count:
        return ()
    per = len(available) // count
    return tuple(available[index * per : (index + 1) * per])
