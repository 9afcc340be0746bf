"""``tpuft doctor``'s look at one worker: what would break a run here, as one JSON line on stdout.

Runs with the worker's base ``python3`` (the one setup's bootstrap runs with: the backend venv may be missing
or broken, which is what is being asked), shipped alone (not the tpuft package, whose presence is one of the
questions), so it is stdlib only and runnable as a plain script: ``python3 doctor_probe.py --spec JSON``. It
only looks: nothing is killed, removed or built; the controller (:mod:`tpuft.ops.doctor`) judges what it
reports.

The controller's spec says what to look at (the venv cache and key, the package folder and hash, the TPU
device paths and libtpu's lockfile of :mod:`tpuft.host.state`, the coordinator port).
``TPUFT_DOCTOR_TPU_PATHS`` (JSON: ``{"devices": [...], "lockfile": ...}``, ``~/`` for the worker's HOME)
replaces the TPU paths: the tests use it to put fake chips and a fake lockfile on hosts that have none; a user
has no reason to set it.

The connectivity preflight runs it in two more modes: ``--listen PORTS`` on slice 0 host 0 (takes the ports
only for the check, after the port check has let them go; one line once listening, another when done) and
``--connect HOST:PORT,...`` on every other launched host (refused, timed out or reached, per address).
``TPUFT_DOCTOR_SKIP_LISTEN`` (ports, comma-separated) makes the listener leave ports closed: the tests'
stand-in for a firewall that drops them.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import hashlib
import json
import os
import selectors
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
TPU_PATHS_ENV = "TPUFT_DOCTOR_TPU_PATHS"
SKIP_LISTEN_ENV = "TPUFT_DOCTOR_SKIP_LISTEN"
DONE = b"done"
"""What the controller's last connection says to end a listener that will not get all its connections."""
PACKAGE_SUFFIXES = {".py", ".yaml", ".typed"}
"""The files :func:`tpuft.ops.common.package_hash` hashes: the same rule names the same package."""
IMPORT_TIMEOUT_S = 120.0


def venv_state(cache: str, key: str, marker: str, lock: str | None = None) -> dict[str, Any]:
    """missing / incomplete (a build was cut off) / stale (built by another base Python) / ready, the way
    setup's bootstrap (``is_ready``) tells them apart; building, when it is not ready and a process holds its
    build lock (``lock``: the lock file's name in the cache, :func:`tpuft.host.bootstrap.lock_path`), with
    the builder the lock file names."""
    folder = Path(os.path.expanduser(cache))
    venv = folder / key
    found: dict[str, Any] = {"path": str(venv), "python": PYTHON}
    state: dict[str, Any]
    if not venv.is_dir():
        state = {"state": "missing"}
    else:
        try:
            record = json.loads((venv / marker).read_text())
        except (OSError, json.JSONDecodeError):
            record = None
        built_by = None if record is None else record.get("base_python", record.get("python"))
        if record is None:
            state = {"state": "incomplete"}
        elif built_by != PYTHON:
            state = {"state": "stale", "built_by": built_by}
        else:
            return {**found, "state": "ready", "built_at": record.get("built_at")}
    builder = lock_holder(folder / lock) if lock else None
    if builder is not None:
        return {**found, "state": "building", "builder": builder, "was": state["state"]}
    return {**found, **state}


def lock_holder(path: Path) -> str | None:
    """What the lock file says of the process that holds it (``pid N on HOST, since HH:MM:SS``), or None when
    no process holds it (the file then names a past builder). Looking takes a shared lock and lets it go at
    once: it never waits, and a build starting in that instant waits a poll (0.2 s) for it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    with os.fdopen(fd) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return handle.read().strip() or "a process that did not say who it is"
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def package_state(folder: str, expected: str) -> dict[str, Any]:
    """Whether the controller's tpuft is on this worker, by the same hash of its files the controller names it
    by."""
    root = Path(os.path.expanduser(folder)) / "tpuft"
    if not root.is_dir():
        return {"state": "missing", "path": str(root)}
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix in PACKAGE_SUFFIXES:
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    found = digest.hexdigest()[:16]
    return {"state": "same" if found == expected else "different", "hash": found, "path": str(root)}


def libtpu_state(venv: str) -> dict[str, Any]:
    """Import libtpu with the venv's python (its package only: nothing opens the chips)."""
    argv = [
        str(Path(venv) / "bin" / "python"),
        "-c",
        "import os, libtpu; print(os.path.dirname(libtpu.__file__))",
    ]
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return {"ok": False, "error": last[:300]}
    return {"ok": True, "path": proc.stdout.strip()}


def _processes() -> list[int]:
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and int(entry.name) != os.getpid()
    ]


def _open_files(pid: int) -> list[str]:
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return []
    targets = []
    for fd in fds:
        try:
            targets.append(os.readlink(fd))
        except OSError:
            continue
    return targets


def describe_process(pid: int) -> dict[str, Any]:
    """pid, owner, command line, the tpuft run it belongs to (readable for one's own processes), and whether
    this user may signal it (what ``train``'s clean-up needs)."""
    info: dict[str, Any] = {"pid": pid}
    try:
        info["uid"] = Path(f"/proc/{pid}").stat().st_uid
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        info["command"] = raw.replace(b"\0", b" ").decode(errors="replace").strip()[:160]
    except OSError:
        pass
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        run = next(
            (
                item.split(b"=", 1)[1].decode(errors="replace")
                for item in environ
                if item.startswith(b"TPUFT_RUN_ID=")
            ),
            None,
        )
        if run:
            info["run_id"] = run
    except OSError:
        pass
    info["ours"] = os.geteuid() == 0 or info.get("uid") == os.geteuid()
    return info


def device_paths(prefixes: list[str]) -> list[str]:
    """The chips' device files: ``/dev/accel0``... for a prefix ``/dev/accel``, everything in
    ``/dev/vfio/``."""
    found = []
    for prefix in prefixes:
        folder, start = os.path.split(prefix)
        try:
            names = sorted(os.listdir(folder or "."))
        except OSError:
            continue
        found += [os.path.join(folder, name) for name in names if name.startswith(start)]
    return found


def tpu_state(devices: list[str], lockfile: str) -> dict[str, Any]:
    """Who holds the chips open (what ``train``'s ``--free-tpu`` check kills), and libtpu's lockfile: its
    holders, or none (stale: left by a process that is gone)."""
    prefixes = tuple(devices)
    holders, lock_holders = [], []
    for pid in _processes():
        files = _open_files(pid)
        if any(target.startswith(prefixes) for target in files):
            holders.append(describe_process(pid))
        if lockfile in files:
            lock_holders.append(describe_process(pid))
    lock: dict[str, Any] = {"path": lockfile, "exists": os.path.lexists(lockfile)}
    if lock["exists"]:
        try:
            owner = os.lstat(lockfile).st_uid
        except OSError:
            owner = None
        folder = os.path.dirname(lockfile) or "."
        sticky = bool(os.stat(folder).st_mode & 0o1000) if os.path.isdir(folder) else False
        lock.update(
            holders=lock_holders,
            uid=owner,
            removable=os.access(folder, os.W_OK) and (not sticky or os.geteuid() in (0, owner)),
        )
    return {"devices": device_paths(list(devices)), "holders": holders, "lockfile": lock}


TCP_STATES = {
    "01": "ESTABLISHED",
    "02": "SYN_SENT",
    "03": "SYN_RECV",
    "04": "FIN_WAIT1",
    "05": "FIN_WAIT2",
    "06": "TIME_WAIT",
    "07": "CLOSE",
    "08": "CLOSE_WAIT",
    "09": "LAST_ACK",
    "0A": "LISTEN",
    "0B": "CLOSING",
}

PORT_SETTLE_S = 75.0
"""How long a port held only by sockets without a live listener (a run that just ended: its connections in
TIME_WAIT for 60 s, a killed process still being torn down) is asked again before it counts as taken."""


def _sockets(port: int) -> list[tuple[str, str]]:
    """(state, inode) of every TCP socket whose local port is ``port``, from /proc/net/tcp*."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.append((TCP_STATES.get(fields[3], fields[3]), fields[9]))
    return found


def _listeners(port: int) -> list[dict[str, Any]]:
    """The processes listening on ``port`` (any address): who took the coordinator's port."""
    inodes = {f"socket:[{inode}]" for state, inode in _sockets(port) if state == "LISTEN"}
    if not inodes:
        return []
    return [describe_process(pid) for pid in _processes() if inodes & set(_open_files(pid))]


def _bind_error(port: int) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
            probe.listen(1)
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def port_state(port: int, settle_s: float = PORT_SETTLE_S) -> dict[str, Any]:
    """Whether the coordinator could listen on ``port`` on every address, as it will. A socket lingering in
    TIME_WAIT does not count as long as servers set SO_REUSEADDR; when the port is taken all the same and no
    process listens on it, what holds it is the remains of a run that just ended, so it is asked again for up
    to ``settle_s`` (a relaunch right after a failure would otherwise be refused for a minute of the kernel's
    bookkeeping)."""
    deadline = time.monotonic() + settle_s
    while True:
        error = _bind_error(port)
        if error is None:
            return {"port": port, "free": True}
        listeners = _listeners(port)
        if listeners or time.monotonic() >= deadline:
            lingering = sorted({state for state, _ in _sockets(port) if state != "LISTEN"})
            return {
                "port": port,
                "free": False,
                "error": error,
                "listeners": listeners,
                "lingering": lingering,
                "waited_s": round(settle_s - max(0.0, deadline - time.monotonic()), 1),
            }
        time.sleep(1.0)


def disk_state(paths: list[str]) -> dict[str, Any]:
    """Free bytes where each path lives (its nearest existing folder), and which filesystem that is."""
    found = {}
    for name in paths:
        path = Path(os.path.expanduser(name))
        while not path.exists() and path != path.parent:
            path = path.parent
        usage = shutil.disk_usage(path)
        found[name] = {
            "free": usage.free,
            "total": usage.total,
            "device": os.stat(path).st_dev,
            "at": str(path),
        }
    return found


def _start_ticks(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def busy_state(current: str) -> dict[str, Any] | None:
    """The run this worker's supervisor serves, when that supervisor lives (the record and the test of
    :mod:`tpuft.host.state`: the pid with its start time, so a reused pid does not
    count)."""
    try:
        record = json.loads(Path(os.path.expanduser(current)).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    pid, ticks = record.get("supervisor_pid"), record.get("supervisor_ticks")
    if record.get("status") not in {"starting", "running"} or not isinstance(pid, int):
        return None
    alive = _start_ticks(pid)
    if alive is None or (ticks is not None and alive != ticks):
        return None
    return {"run_id": record.get("run_id"), "supervisor_pid": pid}


def probe(spec: dict[str, Any]) -> dict[str, Any]:
    report: dict[str, Any] = {"python": PYTHON, "host": socket.gethostname()}
    venv = spec["venv"]
    report["venv"] = venv_state(venv["cache"], venv["key"], venv["marker"], venv.get("lock"))
    report["package"] = package_state(spec["package"]["folder"], spec["package"]["hash"])
    report["busy"] = busy_state(spec["current"])
    tpu = spec.get("tpu")
    if tpu is not None:
        override = os.environ.get(TPU_PATHS_ENV)
        if override:
            tpu = {**tpu, **json.loads(override)}
        # "~/": per worker, for the tests' fakes
        devices = [os.path.expanduser(path) for path in tpu["devices"]]
        report["tpu"] = tpu_state(devices, os.path.expanduser(str(tpu["lockfile"])))
        if report["venv"]["state"] == "ready":
            report["libtpu"] = libtpu_state(report["venv"]["path"])
    if spec.get("port"):
        report["port"] = port_state(int(spec["port"]))
    report["disk"] = disk_state(["~", venv["cache"]])
    return report


def listen(ports: list[int], expect: int, seconds: float) -> dict[str, Any]:
    """Listen on ``ports`` (every address, as the coordinators will) until each open one has had ``expect``
    connections, a connection says ``done``, or ``seconds`` pass. Prints ``{"listening": ...}`` once the
    sockets are open, so that the connecting hosts are started only then."""
    skip = {int(p) for p in os.environ.get(SKIP_LISTEN_ENV, "").split(",") if p.strip()}
    selector = selectors.DefaultSelector()
    errors: dict[str, str] = {}
    for port in ports:
        if port in skip:
            continue
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind(("0.0.0.0", port))
            server.listen(128)
        except OSError as exc:
            errors[str(port)] = exc.strerror or str(exc)
            server.close()
            continue
        selector.register(server, selectors.EVENT_READ, port)
    open_ports = sorted(key.data for key in selector.get_map().values())
    print(json.dumps({"listening": open_ports, "bind_errors": errors}), flush=True)
    accepted = dict.fromkeys(open_ports, 0)
    deadline = time.monotonic() + seconds
    done = False
    while (
        open_ports and not done and time.monotonic() < deadline and any(n < expect for n in accepted.values())
    ):
        for key, _ in selector.select(timeout=min(1.0, max(0.0, deadline - time.monotonic()))):
            conn, _ = key.fileobj.accept()  # type: ignore[union-attr]
            with conn:
                conn.settimeout(2.0)
                try:
                    done = done or conn.recv(16).startswith(DONE)
                    while conn.recv(16):  # the connecting side closes first: its end, not the port's, lingers
                        pass
                except OSError:
                    pass
            accepted[key.data] += 0 if done else 1
    for key in list(selector.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]
    return {"accepted": {str(port): n for port, n in accepted.items()}, "bind_errors": errors}


def connect(addresses: list[str], timeout: float, message: bytes = b"hello") -> dict[str, Any]:
    """Open a TCP connection to each ``host:port``: ``ok``, or why not (``refused``: nothing listens or a
    firewall rejects; ``timed out``: a firewall drops the packets)."""
    found = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        entry: dict[str, Any] = {"address": address, "ok": False}
        try:
            with socket.create_connection((host, int(port)), timeout=timeout) as conn:
                conn.sendall(message)
            entry["ok"] = True
        except TimeoutError:
            entry["error"] = "timed out"
        except OSError as exc:
            entry["error"] = "refused" if exc.errno == errno.ECONNREFUSED else (exc.strerror or str(exc))
        found.append(entry)
    return {"reach": found}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--spec", help="JSON: venv {cache, key, marker, lock}, package {folder, hash}, current, tpu, port"
    )
    parser.add_argument("--listen", help="ports to listen on, comma-separated")
    parser.add_argument(
        "--expect", type=int, default=1, help="--listen: connections to wait for on each port"
    )
    parser.add_argument("--connect", help="host:port addresses to reach, comma-separated")
    parser.add_argument("--send", default="hello", help="--connect: what to say once connected")
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="--listen: the longest wait; --connect: per address"
    )
    args = parser.parse_args(argv)
    if args.listen:
        report = listen([int(p) for p in args.listen.split(",")], args.expect, args.seconds)
    elif args.connect:
        report = connect(args.connect.split(","), args.seconds, args.send.encode())
    elif args.spec:
        report = probe(json.loads(args.spec))
    else:
        parser.error("one of --spec, --listen, --connect")
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
