"""doctor: before paying for a run, ask every worker the launch plan uses what would break it there.

One short probe per worker, in parallel through the fleet (:mod:`tpuft.host.doctor_probe`, shipped alone and
run with the worker's base python, since the venv and the tpuft package are among the questions), then one
tiny timed command for the clocks. The probe only looks; the controller judges what this module gathered
(:mod:`tpuft.ops.doctor_checks`): each check of each worker is ``ok``, ``warn`` (worth knowing, the run would
go on) or ``fail`` (the run would break), with the culprit named (the worker, the pid, the file, the port) and
the numbers behind it.

Some failures ``train`` deals with itself before it launches: it kills this user's processes holding the TPU
chips, removes a stale libtpu lockfile when it may, and refuses a busy worker naming the live run. ``tpuft
doctor`` shows them all, as they are now; :func:`doctor_problems`, the check to run before ``train``, leaves
those out.
"""

from __future__ import annotations

import ipaddress
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from tpuft.backends.registry import layout
from tpuft.config import ClusterConfig, Loaded, RecipeConfig
from tpuft.core.accelerators import lookup
from tpuft.core.errors import TpuftError, UsageError
from tpuft.core.ports import COORDINATOR_PORT, MEGASCALE_PORT
from tpuft.fleet.base import last_json_object
from tpuft.host import doctor_probe
from tpuft.host.bootstrap import MARKER, lock_path
from tpuft.host.state import STATE_DIR, TPU_DEVICES, TPU_LOCKFILE
from tpuft.model.summary import fmt_bytes, summarize
from tpuft.ops.common import PACKAGE_HOME, Session, open_session, package_hash, worker_env
from tpuft.ops.doctor_checks import (
    DoctorReport,
    Finding,
    judge_clock,
    judge_disk,
    judge_free,
    judge_package,
    judge_port,
    judge_storage_disk,
    judge_tpu,
    judge_venv,
)
from tpuft.ops.preflight import check_against_cluster
from tpuft.ops.setup import env_spec, launch_plan

PROBE_HOME = ".tpuft/doctor"
"""Under each worker's HOME: the probe, in a folder named by its content."""


def doctor(config: ClusterConfig, recipe: Loaded[RecipeConfig]) -> DoctorReport:
    """``tpuft doctor RECIPE``: the recipe against the cluster's shape (a located error, exit 2), then every
    check."""
    session = open_session(config)
    check_against_cluster(recipe, session.shape)
    return examine(session, recipe.value, Path(recipe.source).resolve().parent)


def doctor_problems(session: Session, recipe: RecipeConfig, recipe_dir: Path | None = None) -> list[str]:
    """What would break ``recipe``'s run on this session's cluster that ``train`` would not deal with itself
    (it clears stale TPU processes and lockfiles of its user, and refuses a busy cluster with its own
    message): one line per worker and check. For ``train``'s preflight, after the venv is known to be
    there."""
    return examine(session, recipe, recipe_dir).problems(before_train=True)


def examine(session: Session, recipe: RecipeConfig, recipe_dir: Path | None = None) -> DoctorReport:
    spec = env_spec(session, recipe)
    plan = launch_plan(session, recipe)
    workers = tuple(plan.workers)
    tpu = session.shape.target == "tpu"
    report = DoctorReport(
        session.config.name, recipe.backend.kind, session.shape.target, workers, spec.key, package_hash()
    )
    hosts = {w.index: (w.internal_address or w.address) for w in session.cluster.workers}
    # train's rule (ops/trainer_env.py, _coordinator_port): workers on this machine get a port picked free at
    # launch.
    port = None if hosts[workers[0]] in {"localhost", "127.0.0.1"} else COORDINATOR_PORT
    probe_spec = {
        "venv": {
            "cache": session.provider.venv_cache(),
            "key": spec.key,
            "marker": MARKER,
            "lock": lock_path(Path(), spec.key).name,
        },
        "package": {"folder": f"{PACKAGE_HOME}/{report.package}", "hash": report.package},
        "current": f"~/{STATE_DIR}/current.json",
        "tpu": {"devices": list(TPU_DEVICES), "lockfile": TPU_LOCKFILE} if tpu else None,
    }
    reports = _probe(session, spec.python, workers, probe_spec, port)
    checkpoint, how = _checkpoint_bytes(session, recipe, recipe_dir)
    keep = recipe.train.keep_checkpoints + 2
    staged_on_worker = (
        session.cluster.bucket.startswith("gs://") and not layout(recipe.backend.kind).writes_to_bucket
    )
    report.notes.append(how)
    for index in workers:
        data = reports[index]
        found = [
            judge_free(data),
            judge_venv(data, recipe.name),
            judge_package(data, report.package),
            *(judge_tpu(data) if tpu else ()),
            judge_port(data, port if index == workers[0] else None),
            judge_disk(data, probe_spec, checkpoint if staged_on_worker and index == workers[0] else 0, keep),
        ]
        report.findings += [
            Finding(check, index, status, cell, detail, handled)
            for check, status, cell, detail, handled in found
        ]
    report.findings += _reachability(session, spec.python, workers, port, reports)
    if not session.cluster.bucket.startswith("gs://"):
        report.findings.append(
            judge_storage_disk(session.cluster.bucket, checkpoint * keep if checkpoint else None, keep)
        )
    for index, (skew, rtt) in _clocks(session, spec.python, workers).items():
        report.findings.append(judge_clock(index, skew, rtt))
    return report


def _probe_path() -> str:
    source = Path(doctor_probe.__file__)
    return f"{PROBE_HOME}/{package_hash()}/{source.name}"


def _probe(
    session: Session, python: str, workers: tuple[int, ...], spec: dict[str, Any], port: int | None
) -> dict[int, dict[str, Any]]:
    """Ship the probe, run it on every worker at once, and read each one's JSON line."""
    session.fleet.put(Path(doctor_probe.__file__), _probe_path(), workers=workers)
    # One argv for all (the port is cheap to ask everywhere; only the coordinator's worker is judged on it).
    return _run_probe(session, python, workers, ["--spec", json.dumps({**spec, "port": port})])


def _run_probe(
    session: Session,
    python: str,
    workers: tuple[int, ...],
    args: list[str],
    on_line: Any = None,
) -> dict[int, dict[str, Any]]:
    """Run the shipped probe with ``args`` on ``workers``; each one's last JSON line (``on_line`` hears them
    all)."""
    lines: dict[int, list[str]] = {}
    lock = threading.Lock()

    def collect(index: int, line: str) -> None:
        with lock:
            lines.setdefault(index, []).append(line)
        if on_line is not None:
            on_line(index, line)

    extra = {
        name: os.environ[name]
        for name in (doctor_probe.TPU_PATHS_ENV, doctor_probe.SKIP_LISTEN_ENV)
        if os.environ.get(name)
    }
    found: dict[int, dict[str, Any]] = {}
    env = lambda w: worker_env(session.config, extra)  # noqa: E731
    result = session.fleet.run(
        [python, _probe_path(), *args], env=env, workers=workers, on_line=collect, fail_fast=False
    )
    for r in result.results:
        data = last_json_object(lines.get(r.index, []))
        if r.exit_code != 0 or data is None:
            tail = "\n".join("  " + line for line in r.tail[-10:])
            raise TpuftError(
                f"the doctor's probe failed on worker {r.index} (exit code {r.exit_code}):\n{tail}"
            )
        found[r.index] = data
    return found


def _checkpoint_bytes(session: Session, recipe: RecipeConfig, recipe_dir: Path | None) -> tuple[int, str]:
    """One checkpoint's size from the paper estimate (:mod:`tpuft.model.summary`): float32 weights and the
    optimizer state, whole. 0 when the model cannot be sized offline (a note says so)."""
    try:
        summary = summarize(recipe, lookup(session.config.accelerator), recipe_dir=recipe_dir)
    except UsageError as exc:
        return 0, f"checkpoint size unknown ({exc.message}): the disk check counts the venv only"
    optimizer = (
        next((row.bytes for row in summary.memory if row.what == "optimizer"), 0) * summary.setup.shard_over
    )
    size = summary.total_params * 4 + optimizer
    keep = recipe.train.keep_checkpoints
    return size, (
        f"a checkpoint is ~{fmt_bytes(size)} ({summary.total_params:,} float32 parameters and the optimizer "
        f"state); the disk check counts {keep + 2}: train.keep_checkpoints ({keep}), the best, and the one "
        "being written"
    )


# ----------------------------------------------------------------------------------------------------------
# Reachability: the firewall between the hosts


REACH_TIMEOUT_S = 5.0
"""Per address: a VPC firewall drops packets (a connection times out) rather than refusing them."""
LISTEN_S = 120.0
"""The listener's longest wait for the connecting hosts (it ends as soon as each has connected, or is told
to)."""


def _reachability(
    session: Session,
    python: str,
    workers: tuple[int, ...],
    port: int | None,
    reports: dict[int, dict[str, Any]],
) -> list[Finding]:
    """Before a launch on hosts of their own (GCP, not the local pod): does every launched host reach slice 0
    host 0 on the in-run coordinator's port and, for several slices, the cross-slice one? Slice 0 host 0
    listens on them (only for the check: the port check before has just found them free) while the others
    connect."""
    if port is None or len(workers) < 2:
        return []
    first = workers[0]
    if not (reports[first].get("port") or {}).get("free"):
        return [Finding("reach", first, "skip", "port taken")]  # the port check names what holds it
    layout = session.cluster.layout
    ports = [port, *([MEGASCALE_PORT] if layout.slices > 1 else [])]
    host = next(w.internal_address or w.address for w in session.cluster.workers if w.index == first)
    listener: list[dict[int, dict[str, Any]]] = []
    ready = threading.Event()
    thread = threading.Thread(
        target=lambda: listener.append(
            _run_probe(
                session,
                python,
                (first,),
                [
                    "--listen",
                    ",".join(map(str, ports)),
                    "--expect",
                    str(len(workers) - 1),
                    "--seconds",
                    str(LISTEN_S),
                ],
                on_line=lambda index, line: ready.set() if line.startswith('{"listening"') else None,
            )
        ),
        daemon=True,
    )
    thread.start()
    ready.wait(LISTEN_S)
    found: dict[int, dict[str, Any]] = {}
    if ready.is_set():
        addresses = ",".join(f"{host}:{p}" for p in ports)
        found = _run_probe(
            session, python, workers[1:], ["--connect", addresses, "--seconds", str(REACH_TIMEOUT_S)]
        )
        if thread.is_alive():  # someone could not connect: the listener would wait for it in vain
            opened = [p for p in ports if p not in _refused_everywhere(found, host)]
            if opened:
                _run_probe(
                    session,
                    python,
                    (first,),
                    [
                        "--connect",
                        f"127.0.0.1:{opened[0]}",
                        "--send",
                        "done",
                        "--seconds",
                        str(REACH_TIMEOUT_S),
                    ],
                )
    thread.join(LISTEN_S)
    if not listener:
        return [
            Finding("reach", first, "fail", "no listener", "the reachability probe's listener did not start")
        ]
    errors = listener[0][first].get("bind_errors") or {}
    findings = [_listening(first, layout.name(first), errors)]
    rule = _firewall_rule(session, ports)
    for index in workers[1:]:
        failed = [r for r in found.get(index, {}).get("reach", []) if not r["ok"]]
        if not failed:
            findings.append(
                Finding("reach", index, "ok", "ok", f"reaches {host} on tcp:{','.join(map(str, ports))}")
            )
            continue
        what = "; ".join(f"{r['address']} ({r.get('error')})" for r in failed)
        findings.append(
            Finding(
                "reach",
                index,
                "fail",
                failed[0].get("error", "no"),
                f"{layout.name(index)} cannot reach slice 0 host 0 at {what}: {rule}",
            )
        )
    return findings


def _refused_everywhere(found: dict[int, dict[str, Any]], host: str) -> set[int]:
    """Ports no host reached (nothing listens there to be told ``done``)."""
    results = [r for report in found.values() for r in report.get("reach", [])]
    return {
        int(r["address"].rsplit(":", 1)[1])
        for r in results
        if not any(o["ok"] and o["address"] == r["address"] for o in results)
    }


def _listening(index: int, name: str, errors: dict[str, str]) -> Finding:
    if not errors:
        return Finding("reach", index, "ok", "listens")
    what = "; ".join(f"port {port} ({error})" for port, error in errors.items())
    return Finding(
        "reach", index, "fail", "cannot listen", f"{name} (the coordinators' host) cannot listen on {what}"
    )


def _firewall_rule(session: Session, ports: list[int]) -> str:
    """The missing rule, as a command: the ports, the VPC network, and a source range that covers the hosts'
    internal addresses."""
    network = str(session.config.gcp.network or "default")
    allow = ",".join(f"tcp:{p}" for p in ports)
    return (
        f"allow {allow} from the TPU hosts' range in the VPC network {network}: gcloud "
        f"compute firewall-rules create tpuft-{session.config.name}-internal --network={network} "
        f"--allow={allow} --source-ranges={_source_range(session)}"
    )


def _source_range(session: Session) -> str:
    """The smallest /16-or-wider range holding every host's internal address (the subnet's own range is
    better)."""
    try:
        addresses = [ipaddress.ip_address(w.internal_address or w.address) for w in session.cluster.workers]
    except ValueError:
        return "<the hosts' internal CIDR>"
    network = ipaddress.ip_network(f"{addresses[0]}/{16 if addresses[0].version == 4 else 64}", strict=False)
    while not all(a in network for a in addresses):
        network = network.supernet()
    return str(network)


# ----------------------------------------------------------------------------------------------------------
# Clocks


CLOCK_COMMAND = (
    "import os, time\n"
    "now = time.time()\n"
    "try:\n"
    "    ticks = int(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19])\n"
    "    ran = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf('SC_CLK_TCK')\n"
    "except (OSError, ValueError, AttributeError, IndexError):\n"
    "    ran = 0.0\n"
    "print(repr(now), repr(max(ran, 0.0)), flush=True)\n"
)
"""Prints the worker's time and how long its python had been running by then (its start-up, which is no part
of the round trip's uncertainty: the time was read after it)."""
CLOCK_TICK_S = 0.02
"""The start-up is known to a clock tick (10 ms): the window is widened by two."""


def _clocks(session: Session, python: str, workers: tuple[int, ...]) -> dict[int, tuple[float, float]]:
    """worker -> (its clock minus this one's, the window the reading fell in), from one tiny command: its time
    was read after its python started and before its line arrived here, so it is compared with the midpoint of
    that window (connections are open by now: the probe ran)."""
    arrived: dict[int, tuple[float, float]] = {}
    started = time.time()

    def stamp(index: int, line: str) -> None:
        now = time.time()
        try:
            theirs, ran = (float(part) for part in line.split())
        except ValueError:
            return
        earliest = min(started + max(ran - CLOCK_TICK_S, 0.0), now)
        arrived[index] = (theirs - (earliest + now) / 2, now - earliest)

    argv = [python, "-c", CLOCK_COMMAND]
    session.fleet.run(
        argv, env=lambda w: worker_env(session.config), workers=workers, on_line=stamp, fail_fast=False
    )
    return {index: arrived.get(index, (float("nan"), float("nan"))) for index in workers}
