"""What the doctor finds and how it judges it: the findings and the report (one ``ok``, ``warn``, ``fail`` or
``skip`` per worker and check, the culprit named), and the verdict on each part of one worker's probe report
(free, venv, tpuft, the TPU chips and libtpu's lock, the coordinator's port, the disk) and on a clock reading.

Apart from :mod:`tpuft.ops.doctor` because these are pure functions of what was measured: no fleet, no
session, no command run, so that each verdict is tested on a hand-written report; the doctor gathers the
measurements (the probe, the reachability listener, the clock command) and hands them here.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from tpuft.host.bootstrap import MARKER
from tpuft.model.summary import fmt_bytes

Status = Literal["ok", "warn", "fail", "skip"]
CHECKS = ("free", "venv", "tpuft", "libtpu", "TPU chips", "libtpu lock", "port", "reach", "disk", "clock")
"""The table's columns, in order; the controller's own row has only ``disk`` (a local run storage)."""
VENV_ESTIMATE_BYTES = 8 * 2**30
"""Disk a backend venv takes once built (measured: 1.7 GB Keras, 3.3 GB T5X, 7.7 GB PyTorch/XLA on CPU): an
estimate for a worker whose venv is still to be built."""
CLOCK_WARN_S = 1.0
CLOCK_FAIL_S = 15.0
"""Beyond this the workers' and the controller's liveness records disagree: a supervisor refreshes its record
every 15 s and a run counts as alive while a record is under a minute old."""
CONTROLLER = -1
"""The ``worker`` of a finding about this machine (the run storage when it is a local folder)."""


@dataclass
class Finding:
    check: str
    worker: int
    """A cluster worker's index, or :data:`CONTROLLER`."""
    status: Status
    cell: str
    """A few words for the table's cell."""
    detail: str = ""
    """One line: what is wrong, the culprit named, what to do."""
    train_handles: bool = False
    """``train`` deals with it itself before launching: it clears it (this user's stale TPU processes, a
    removable stale lockfile) or refuses with its own message (a busy worker: the live run's id and how to
    stop it)."""

    @property
    def where(self) -> str:
        return "this machine" if self.worker == CONTROLLER else f"worker {self.worker}"

    def line(self) -> str:
        return f"{self.where}: {self.check}: {self.detail or self.cell}"


@dataclass
class DoctorReport:
    cluster: str
    backend: str
    target: str
    workers: tuple[int, ...]
    venv_key: str
    package: str
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(f.status == "fail" for f in self.findings)

    def problems(self, *, before_train: bool = False) -> list[str]:
        """The failures, one line each; ``before_train``: only those ``train`` would not deal with itself."""
        return [
            f.line() for f in self.findings if f.status == "fail" and not (before_train and f.train_handles)
        ]

    def warnings(self) -> list[str]:
        return [f.line() for f in self.findings if f.status == "warn"]

    def cell(self, worker: int, check: str) -> Finding | None:
        return next((f for f in self.findings if f.worker == worker and f.check == check), None)

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "cluster": self.cluster,
            "backend": self.backend,
            "target": self.target,
            "workers": list(self.workers),
            "venv_key": self.venv_key,
            "package": self.package,
            "problems": self.problems(),
            "warnings": self.warnings(),
            "notes": self.notes,
            "checks": [asdict(f) for f in self.findings],
        }


Judged = tuple[str, Status, str, str, bool]
"""(check, status, cell, detail, whether train handles it itself)."""


def judge_free(data: dict[str, Any]) -> Judged:
    busy = data.get("busy")
    if busy is None:
        return ("free", "ok", "yes", "", False)
    run = busy.get("run_id")
    return (
        "free",
        "fail",
        f"run {run}",
        f"run {run} is training here (supervisor pid {busy['supervisor_pid']}): "
        f"train refuses a busy cluster; stop it: tpuft stop {run}",
        True,
    )


def judge_venv(data: dict[str, Any], recipe: str) -> Judged:
    venv = data["venv"]
    state = venv["state"]
    if state == "ready":
        return ("venv", "ok", "ready", "", False)
    if state == "building":
        return (
            "venv",
            "warn",
            "building",
            f"the venv {venv['path']} is being built now by {venv.get('builder')} (it holds the build's "
            f"lock): not ready yet; wait for that setup to end, then ask again: tpuft doctor {recipe}",
            False,
        )
    why = {
        "missing": f"the venv {venv['path']} is not there",
        "incomplete": f"the venv {venv['path']} has no completion marker ({MARKER}): its build was cut off",
        "stale": f"the venv {venv['path']} was built by Python {venv.get('built_by')}, this worker's is "
        f"{venv['python']}",
    }[state]
    return ("venv", "fail", state, f"{why}; run: tpuft setup {recipe}", False)


def judge_package(data: dict[str, Any], expected: str) -> Judged:
    package = data["package"]
    if package["state"] == "same":
        return ("tpuft", "ok", "same", "", False)
    if package["state"] == "missing":
        return (
            "tpuft",
            "warn",
            "not shipped",
            f"this tpuft ({expected}) is not on the worker yet: train ships it",
            False,
        )
    return (
        "tpuft",
        "warn",
        "changed",
        f"{package['path']} hashes to {package['hash']}, not {expected} (changed on the "
        "worker): train copies it again",
        False,
    )


def _who(process: dict[str, Any]) -> str:
    run = f", run {process['run_id']}" if process.get("run_id") else ""
    return f"pid {process['pid']} ({process.get('command') or '?'}{run})"


def judge_tpu(data: dict[str, Any]) -> list[Judged]:
    tpu = data["tpu"]
    found: list[Judged] = []
    libtpu = data.get("libtpu")
    if libtpu is None:
        found.append(("libtpu", "skip", "no venv", "", False))
    elif libtpu["ok"]:
        found.append(("libtpu", "ok", "imports", "", False))
    else:
        found.append(
            ("libtpu", "fail", "no import", f"libtpu does not import in the venv: {libtpu['error']}", False)
        )
    holders = tpu["holders"]
    if not tpu["devices"]:
        found.append(
            ("TPU chips", "fail", "no chips", "no TPU device (/dev/accel*, /dev/vfio/*) on this host", False)
        )
    elif holders:
        mine = all(p.get("ours") for p in holders) and data.get("busy") is None
        who = "; ".join(_who(p) for p in holders)
        fix = (
            "train kills it before launching"
            if mine
            else "a live run's: stop it first"
            if data.get("busy")
            else "train cannot kill it (another user's): stop it on the host"
        )
        found.append(
            (
                "TPU chips",
                "fail",
                f"held by {holders[0]['pid']}",
                f"the TPU chips are held by {who}: {fix}",
                mine,
            )
        )
    else:
        found.append(("TPU chips", "ok", f"{len(tpu['devices'])} free", "", False))
    lock = tpu["lockfile"]
    if not lock["exists"]:
        found.append(("libtpu lock", "ok", "none", "", False))
    elif lock["holders"]:
        who = "; ".join(_who(p) for p in lock["holders"])
        found.append(("libtpu lock", "fail", "in use", f"{lock['path']} is held by {who}", False))
    else:
        fix = (
            "train removes it before launching"
            if lock["removable"]
            else "train cannot remove it (not this user's): remove it on the host"
        )
        found.append(
            (
                "libtpu lock",
                "fail",
                "stale",
                f"{lock['path']} is left by a process that is gone: {fix}",
                lock["removable"],
            )
        )
    return found


def judge_port(data: dict[str, Any], port: int | None) -> Judged:
    if port is None:
        return ("port", "skip", "-", "", False)
    state = data.get("port") or {}
    if state.get("free"):
        return ("port", "ok", f"{port} free", "", False)
    listeners = state.get("listeners", [])
    if listeners:
        who = "; ".join(_who(p) for p in listeners)
    elif state.get("lingering"):
        who = (
            f"no live process: sockets in {', '.join(state['lingering'])} stayed on it for "
            f"{state.get('waited_s')} s "
            "(the remains of a process that ended; the kernel frees them within minutes)"
        )
    else:
        who = "a process this user cannot see"
    return (
        "port",
        "fail",
        f"{port} taken",
        f"the coordinator's port {port} is taken ({state.get('error')}) by {who}",
        False,
    )


def judge_disk(data: dict[str, Any], spec: dict[str, Any], checkpoint: int, keep: int) -> Judged:
    """HOME needs ``keep`` staged checkpoints of ``checkpoint`` bytes (worker 0 of a bucket run whose trainer
    does not write the bucket itself), the venv cache a venv still to build; on one filesystem, both."""
    home, cache = data["disk"]["~"], data["disk"][spec["venv"]["cache"]]
    checkpoints = checkpoint * keep
    venv = VENV_ESTIMATE_BYTES if data["venv"]["state"] != "ready" else 0
    needs = {home["device"]: 0, cache["device"]: 0}
    needs[home["device"]] += checkpoints
    needs[cache["device"]] += venv
    short = [
        (device, need)
        for device, need in needs.items()
        if need > (home if device == home["device"] else cache)["free"]
    ]
    free = min(home["free"], cache["free"])
    parts = ([f"{keep} checkpoints {fmt_bytes(checkpoints)}"] if checkpoints else []) + (
        [f"a venv ~{fmt_bytes(venv)}"] if venv else []
    )
    wants = (
        f"needs {fmt_bytes(sum(needs.values()))} ({' + '.join(parts)})" if parts else "nothing to write here"
    )
    if short:
        where = home["at"] if short[0][0] == home["device"] else cache["at"]
        return (
            "disk",
            "fail",
            f"{fmt_bytes(free)} free",
            f"{fmt_bytes(free)} free at {where}, {wants}",
            False,
        )
    return ("disk", "ok", f"{fmt_bytes(free)} free", f"{fmt_bytes(free)} free, {wants}", False)


def judge_storage_disk(folder: str, needed: int | None, keep: int) -> Finding:
    path = Path(folder).expanduser()
    while not path.exists() and path != path.parent:
        path = path.parent
    free = os.statvfs(path).f_bavail * os.statvfs(path).f_frsize
    if needed is None:
        return Finding(
            "disk",
            CONTROLLER,
            "warn",
            f"{fmt_bytes(free)} free",
            f"{fmt_bytes(free)} free for the run storage {folder}; the checkpoints' size is unknown",
        )
    status: Status = "fail" if needed > free else "ok"
    return Finding(
        "disk",
        CONTROLLER,
        status,
        f"{fmt_bytes(free)} free",
        f"{fmt_bytes(free)} free for the run storage {folder}, needs {fmt_bytes(needed)} ({keep} "
        "checkpoints)",
    )


def judge_clock(index: int, skew: float, rtt: float) -> Finding:
    if skew != skew:  # NaN: no line came back
        return Finding("clock", index, "warn", "no answer", "the clock command printed no time")
    cell = f"{skew:+.2f} s"
    detail = f"clock {skew:+.3f} s from this machine's (± {rtt / 2:.3f} s)"
    off = abs(skew) - rtt / 2  # what is certainly off, wherever in its window the reading fell
    if off > CLOCK_FAIL_S:
        return Finding(
            "clock", index, "fail", cell, f"{detail}: liveness records would be misread; sync it (chrony/NTP)"
        )
    if off > CLOCK_WARN_S:
        return Finding(
            "clock", index, "warn", cell, f"{detail}: logs and heartbeats misorder; sync it (chrony/NTP)"
        )
    return Finding("clock", index, "ok", cell, detail)
