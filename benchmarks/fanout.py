"""Fan-out to N SSH workers: tpuft's SSH fleet vs a sequential `ssh` loop vs `ssh` processes in parallel.

A pod of real OpenSSH servers on loopback (tests/rigs/sshd_pod.py; 127.0.1.(10+i)) stands in for a TPU pod slice,
and the fake TPU API (tests/rigs/fake_tpu.py) hands their addresses out as the node's network endpoints. For N in
1, 8, 32, 64 workers, each method runs `true` on every worker, 5 times after a warm-up; the table shows medians:
- tpuft fleet: a fresh Python process (start-up included) running tpuft's SSH fleet on the N workers;
- tpuft exec: the whole CLI, `tpuft exec -- true` (Typer, the cluster file, the cluster's workers as remembered from
  the last API answer in the past 10 minutes, then the fleet), with the connection agent off (TPUFT_NO_AGENT=1);
- tpuft exec (warm agent): the same command once the cluster's connection agent (tpuft/ops/agent.py) runs: one run
  starts it, then the command goes through its open connections (no cluster file loading, no handshake);
- parallel ssh / sequential ssh: OpenSSH's client, same key, same workers.
It also reports the fleet's client-side CPU per worker (the part that would not parallelise on a real pod, where
every worker has its own CPUs) and the time to the first output line (`echo` instead of `true`).
``--login stock`` makes the workers' sessions skip the login user's ~/.bashrc (see ``SshdPod.stock_login``): what each
session costs a server is then sshd's own work, as on a TPU VM, instead of this machine's pyenv init.

On this 2-core machine the sshd servers share the client's cores, so the parallel-ssh column is the physical floor.
Targets: at 64 workers <= 1.1x the parallel-ssh column; at 1 worker <= 0.5 s; far ahead of the sequential loop. With a
warm agent: at 1 worker <= one plain `ssh host true`; at 64 workers <= 0.5x the parallel-ssh column.
Multislice: ``--shapes 1x64,4x16`` compares cluster shapes of the same host count instead (SLICES x HOSTS per slice:
one v4-512 node against a queued resource of 4 v4-128 slices, nodes ``bench-4x16-0..3`` with 16 workers each); per
shape, the fan-out of `tpuft exec -- true` to every host (cold, then through a warm agent), the first `tpuft exec`
after `create` (it reads every slice's node and pins its host keys: one GetGuestAttributes per slice) and parallel ssh.
Needs openssh-server and root (to bind the loopback addresses). Run: python benchmarks/fanout.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CHILD = """
import json, resource, sys, time
started = time.perf_counter()
from pathlib import Path
from tpuft.fleet.ssh import SshFleet, SshSettings
from tpuft.records import Worker
spec = json.loads(sys.argv[1])
workers = [Worker(i, a) for i, a in enumerate(spec["addresses"])]
fleet = SshFleet(workers, SshSettings(user=spec["user"], key_file=Path(spec["key"]), port=spec["port"]))
first = []
def on_line(index, line):
    if not first:
        first.append(time.perf_counter() - started)
result = fleet.run(spec["argv"], on_line=on_line)
fleet.close()
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"ok": result.ok, "first_line": first[0] if first else None, "cpu": usage.ru_utime + usage.ru_stime}))
"""


def tpuft_fanout(pod, count: int, argv: list[str]) -> dict:
    spec = {"addresses": pod.addresses[:count], "user": pod.user, "key": str(pod.client_key), "port": pod.port, "argv": argv}
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - started
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    data = json.loads(out.stdout.strip().splitlines()[-1])
    if not data["ok"]:
        raise RuntimeError("a worker failed")
    return {"wall": wall, **data}


ACCELERATOR_FOR_HOSTS = {1: "v4-8", 8: "v4-64", 16: "v4-128", 32: "v4-256", 64: "v4-512"}


ENV: dict[str, str] = {}
"""Environment of the tpuft subprocesses: the GCS emulator (create makes the bucket) and a private TPUFT_HOME."""


def tpuft_exec_cluster(pod, server, count: int, root: Path, slices: int = 1) -> Path:
    """A cluster file for `tpuft exec`: a TPU node on the fake TPU API whose workers are the pod's sshd servers; with
    ``slices`` > 1 a multislice queued resource of that many nodes of ``count`` workers each."""
    accelerator = ACCELERATOR_FOR_HOSTS[count]
    name = f"bench-{count}" if slices == 1 else f"bench-{slices}x{count}"
    multislice = f", queued: true, slices: {slices}" if slices > 1 else ""
    path = root / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nprovider: gcp\naccelerator: {accelerator}\n"
        f"gcp: {{project: tpuft-bench, zone: us-central2-b, tpu_api_endpoint: '{server.endpoint}'{multislice}}}\n"
        f"ssh: {{user: {pod.user}, key_file: '{pod.client_key}', port: {pod.port}}}\n"
    )
    subprocess.run([sys.executable, "-m", "tpuft", "create", "-c", str(path), "--yes"], check=True, capture_output=True, cwd=REPO, env=ENV)
    return path


def tpuft_exec(cluster: Path, *, agent: bool = False) -> float:
    """One `tpuft exec -- true`; without ``agent`` the connection agent is off (the cold path every time)."""
    env = dict(ENV) if agent else {**ENV, "TPUFT_NO_AGENT": "1"}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tpuft", "exec", "-c", str(cluster), "--", "true"], check=True, capture_output=True, cwd=REPO, env=env)
    return time.perf_counter() - started


def agent_call(what: str, cluster: Path) -> object:
    """``ping`` or ``stop`` the cluster's agent from here, in the tpuft subprocesses' environment."""
    from tpuft.ops import agent_client

    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update({k: v for k, v in ENV.items() if k != "TPUFT_NO_AGENT"})
    try:
        return getattr(agent_client, what)(str(cluster))
    finally:
        os.environ.clear()
        os.environ.update(saved)


def warm_agent(cluster: Path, timeout: float = 120) -> None:
    """Run once with the agent on (the cold run starts it in the background) and wait until it answers."""
    tpuft_exec(cluster, agent=True)
    deadline = time.monotonic() + timeout
    while agent_call("ping", cluster) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the connection agent did not start; see {ENV['TPUFT_HOME']}/agents/*.log")
        time.sleep(0.2)


def ssh_sequential(pod, count: int) -> float:
    started = time.perf_counter()
    for i in range(count):
        subprocess.run(pod.ssh_argv(i, "true"), check=True, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def ssh_parallel(pod, count: int) -> float:
    started = time.perf_counter()
    procs = [subprocess.Popen(pod.ssh_argv(i, "true"), stderr=subprocess.DEVNULL) for i in range(count)]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise RuntimeError(f"ssh failed: {codes}")
    return time.perf_counter() - started


def compare_shapes(pod, server, shapes: list[tuple[int, int]], runs: int, root: Path, console) -> None:
    """The same hosts as one slice or several: what multislice costs a command sent to every host."""
    from rich.table import Table

    rows = []
    for slices, hosts in shapes:
        cluster = tpuft_exec_cluster(pod, server, hosts, root, slices)
        first = tpuft_exec(cluster)  # reads every slice's node, publishes the key, pins every slice's host keys
        ssh_parallel(pod, slices * hosts)
        cold = [tpuft_exec(cluster) for _ in range(runs)]
        warm_agent(cluster)
        tpuft_exec(cluster, agent=True)
        warm = [tpuft_exec(cluster, agent=True) for _ in range(runs)]
        agent_call("stop", cluster)
        par = [ssh_parallel(pod, slices * hosts) for _ in range(runs)]
        subprocess.run([sys.executable, "-m", "tpuft", "delete", "-c", str(cluster), "--yes"], check=True,
                       capture_output=True, cwd=REPO, env=ENV)  # the next shape reuses the addresses
        rows.append((slices, hosts, first, statistics.median(cold), statistics.median(warm), statistics.median(par)))
        console.log(f"{slices} x {hosts} done")
    table = Table(title=f"fan-out of `tpuft exec -- true` to every host, one slice against several (median of {runs})")
    for column in ("shape", "hosts", "first exec after create s", "tpuft exec s", "tpuft exec (warm agent) s",
                   "parallel ssh s", "exec / parallel"):
        table.add_column(column, justify="right")
    for slices, hosts, first, cold, warm, par in rows:
        table.add_row(f"{slices} x {hosts}", str(slices * hosts), f"{first:.3f}", f"{cold:.3f}", f"{warm:.3f}",
                      f"{par:.3f}", f"{cold / par:.2f}x")
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1,8,32,64")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--shapes", default="", help="SLICESxHOSTS,... (e.g. 1x64,4x16): compare multislice shapes of "
                        "the same hosts instead of the sizes")
    parser.add_argument(
        "--login", choices=("machine", "stock"), default="machine",
        help="machine: the workers' sessions run this machine's login shell as it is (root's ~/.bashrc: pyenv init, "
        "about 0.1 CPU-second each, on the client's cores); stock: the shell skips ~/.bashrc, as a stock TPU VM "
        "image's non-interactive shells effectively do",
    )
    args = parser.parse_args()
    from rich.console import Console
    from rich.table import Table

    from tests.rigs.fake_tpu import FakeTpuServer
    from tests.rigs.gcs_emulator import GcsEmulator
    from tests.rigs.sshd_pod import SshdPod

    # A sandbox that sets PYTHONDONTWRITEBYTECODE makes every tpuft process compile its modules from source (about
    # 70 ms a start); an installed tpuft has its bytecode cached, which is what a user's `tpuft exec` runs with.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    shapes = [tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(",") if shape]
    sizes = [slices * hosts for slices, hosts in shapes] if shapes else [int(s) for s in args.sizes.split(",")]
    console = Console(width=150)
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        SshdPod(Path(tmp) / "pod", workers=max(sizes), stock_login=args.login == "stock") as pod,
        FakeTpuServer(operation_polls=0) as server,
        GcsEmulator() as gcs,
    ):
        server.worker_addresses = pod.addresses
        server.host_keys.update(pod.host_keys)  # the workers' host keys, as the API publishes them
        ENV.update({**os.environ, **gcs.env(), "TPUFT_HOME": str(Path(tmp) / "home"), "TPUFT_AGENT_IDLE_S": "600"})
        ENV.pop("TPUFT_NO_AGENT", None)
        if shapes:
            compare_shapes(pod, server, shapes, args.runs, Path(tmp), console)  # type: ignore[arg-type]
            return
        for count in sizes:
            cluster = tpuft_exec_cluster(pod, server, count, Path(tmp))
            tpuft_exec(cluster)  # warm-up; also publishes the key in the node metadata once
            tpuft_fanout(pod, count, ["true"])  # warm-up (page cache, sshd host key loads)
            ssh_parallel(pod, count)
            cli = [tpuft_exec(cluster) for _ in range(args.runs)]
            warm_agent(cluster)
            tpuft_exec(cluster, agent=True)  # warm-up of the warm path itself
            warm = [tpuft_exec(cluster, agent=True) for _ in range(args.runs)]
            agent_call("stop", cluster)  # its connections would share the cores with the other columns
            tp = [tpuft_fanout(pod, count, ["true"]) for _ in range(args.runs)]
            par = [ssh_parallel(pod, count) for _ in range(args.runs)]
            seq = [ssh_sequential(pod, count) for _ in range(args.runs)]
            first = [tpuft_fanout(pod, count, ["echo", "hi"])["first_line"] for _ in range(args.runs)]
            row = {
                "workers": count,
                "tpuft": statistics.median(t["wall"] for t in tp),
                "tpuft_exec": statistics.median(cli),
                "tpuft_exec_warm": statistics.median(warm),
                "parallel_ssh": statistics.median(par),
                "sequential_ssh": statistics.median(seq),
                "cpu_per_worker": statistics.median(t["cpu"] for t in tp) / count,
                "first_line": statistics.median(first),
            }
            rows.append(row)
            console.log(f"{count} workers done")
    table = Table(title=f"fan-out: `true` on N loopback sshd workers (median of {args.runs}, after a warm-up; "
                        f"--login {args.login})")
    for column in (
        "workers", "tpuft exec s", "tpuft exec (warm agent) s", "tpuft fleet s", "parallel ssh s", "sequential ssh s",
        "exec / parallel", "warm / parallel", "fleet / parallel", "fleet CPU ms/worker", "first line s",
    ):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            str(row["workers"]),
            f"{row['tpuft_exec']:.3f}",
            f"{row['tpuft_exec_warm']:.3f}",
            f"{row['tpuft']:.3f}",
            f"{row['parallel_ssh']:.3f}",
            f"{row['sequential_ssh']:.3f}",
            f"{row['tpuft_exec'] / row['parallel_ssh']:.2f}x",
            f"{row['tpuft_exec_warm'] / row['parallel_ssh']:.2f}x",
            f"{row['tpuft'] / row['parallel_ssh']:.2f}x",
            f"{row['cpu_per_worker'] * 1000:.1f}",
            f"{row['first_line']:.3f}",
        )
    console.print(table)
    big, small = rows[-1], rows[0]
    console.print(
        f"targets (tpuft exec): {big['workers']} workers {big['tpuft_exec'] / big['parallel_ssh']:.2f}x parallel ssh "
        f"(<= 1.1x); {small['workers']} worker {small['tpuft_exec']:.2f} s (<= 0.5 s); sequential ssh loop at "
        f"{big['workers']} workers {big['sequential_ssh'] / big['tpuft_exec']:.1f}x slower than tpuft exec"
    )
    one = next((row for row in rows if row["workers"] == 1), None)
    console.print(
        f"targets (warm agent): {big['workers']} workers {big['tpuft_exec_warm'] / big['parallel_ssh']:.2f}x parallel ssh "
        f"(<= 0.5x)"
        + (f"; 1 worker {one['tpuft_exec_warm']:.3f} s vs {one['parallel_ssh']:.3f} s for one plain ssh (<= 1x)" if one else "")
    )


if __name__ == "__main__":
    main()
