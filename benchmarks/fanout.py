"""Fan-out to N SSH workers, up to a 1,024-host pod: `tpuft exec` cold and through its agent, against `ssh`
processes in parallel and gcloud's own `gcloud compute tpus tpu-vm ssh --worker=all`.

A pod of real OpenSSH servers on loopback (tests/rigs/sshd_pod.py; 127.0.1.10 onwards, then 127.0.2.x, ...)
stands in for a TPU pod slice, and the fake TPU API (tests/rigs/fake_tpu.py) hands their addresses and host
keys out as the node's network endpoints and guest attributes. Up to 64 workers each has its own sshd; past
that 16 addresses share one sshd (OpenSSH listens on at most 16), with 16x sshd's default MaxStartups, which
is a real host's limit per address (``--per-sshd``). For N in 1, 16, 64, 256, 1,024 workers (``--sizes``),
each column runs `true` on every worker ``--runs`` times (default 3) after a warm-up, the cold, parallel-ssh
and gcloud runs taking turns (a burst of load from elsewhere then lands on all of them alike); the table shows
medians:
- tpuft cold: the whole CLI, `tpuft exec -- true` (Typer, the cluster file, the cluster's workers as
  remembered from the last API answer in the past 10 minutes, then the fleet), with the connection agent off
  (TPUFT_NO_AGENT=1); its peak RSS (wait4's rusage) and the most descriptors it held (/proc/PID/fd, sampled
  every 50 ms); it starts with a login shell's soft limit of 1,024 open files, which it must raise itself at
  1,024 workers;
- tpuft warm agent: the same command once the cluster's connection agent (tpuft/ops/agent.py) runs: one run
  starts it, then the command goes through its open connections (no cluster file loading, no handshake); the
  agent's peak RSS (VmHWM) and descriptors while it holds a connection per worker;
- parallel ssh: OpenSSH's client, one process per worker, same key, same workers;
- gcloud: `gcloud compute tpus tpu-vm ssh bench-N --worker=all --command=true` (/usr/bin/gcloud) pointed at
  the fake API (CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU and _COMPUTE, a token file, its own config folder and
  HOME): it reads the node, the guest attributes and the project (OS Login), then starts an OpenSSH client per
  worker, all at once;
- up to ``--extras-up-to`` workers (default 64) also: tpuft's SSH fleet alone in a fresh Python process, a
  sequential `ssh` loop, the fleet's client-side CPU per worker and the time to the first output line
  (`echo`).
``--login stock`` makes the workers' sessions skip the login user's ~/.bashrc (see ``SshdPod.stock_login``):
what each session costs a server is then sshd's own work, as on a TPU VM, instead of this machine's pyenv
init.

On this 2-core machine the sshd servers share the client's cores, so the parallel-ssh column is the physical
floor. Targets (issue 31): cold N=1 <= 1.0x one ssh; cold N=64 <= 0.3x parallel ssh; cold N=1,024 <= 0.3x
gcloud; the controller's RSS < 1 GB and the agent's < 2 GB at 1,024 workers; warm as before (<= 0.5x parallel
ssh at 64). Multislice: ``--shapes 1x64,4x16`` compares cluster shapes of the same host count instead (SLICES
x HOSTS per slice: one v4-512 node against a queued resource of 4 v4-128 slices, nodes ``bench-4x16-0..3``
with 16 workers each); per shape, the fan-out of `tpuft exec -- true` to every host (cold, then through a warm
agent), the first `tpuft exec` after `create` (it reads every slice's node and pins its host keys: one
GetGuestAttributes per slice) and parallel ssh. Needs openssh-server and root (to bind the loopback
addresses). A full run (1..1,024, 3 runs) takes about 15 min. Run: python benchmarks/fanout.py --login stock
(quick: --sizes 1,16 --runs 1 --gcloud off)
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

from tests.rigs.gcloud import GCLOUD  # noqa: E402
from tests.rigs.gcloud import gcloud_env as rig_gcloud_env  # noqa: E402

CHILD = """
import json, resource, sys, time
started = time.perf_counter()
from pathlib import Path
from tpuft.fleet.ssh import SshFleet, SshSettings
from tpuft.core.records import Worker
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
"""  # noqa: E501 (a script run in another interpreter)


def tpuft_fanout(pod, count: int, argv: list[str]) -> dict:
    spec = {
        "addresses": pod.addresses[:count],
        "user": pod.user,
        "key": str(pod.client_key),
        "port": pod.port,
        "argv": argv,
    }
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, cwd=REPO
    )
    wall = time.perf_counter() - started
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    data = json.loads(out.stdout.strip().splitlines()[-1])
    if not data["ok"]:
        raise RuntimeError("a worker failed")
    return {"wall": wall, **data}


ACCELERATOR_FOR_HOSTS = {
    1: "v4-8",
    2: "v4-16",
    4: "v4-32",
    8: "v4-64",
    16: "v4-128",
    32: "v4-256",
    64: "v4-512",
    128: "v4-1024",
    256: "v4-2048",
    512: "v4-4096",
    1024: "v5p-8192",
}


ENV: dict[str, str] = {}
"""Environment of the tpuft subprocesses: the GCS emulator (create makes the bucket) and a private
TPUFT_HOME."""


def tpuft_exec_cluster(pod, server, count: int, root: Path, slices: int = 1) -> Path:
    """A cluster file for `tpuft exec`: a TPU node on the fake TPU API whose workers are the pod's sshd
    servers; with ``slices`` > 1 a multislice queued resource of that many nodes of ``count`` workers each."""
    accelerator = ACCELERATOR_FOR_HOSTS[count]
    name = f"bench-{count}" if slices == 1 else f"bench-{slices}x{count}"
    multislice = f", queued: true, slices: {slices}" if slices > 1 else ""
    path = root / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nprovider: gcp\naccelerator: {accelerator}\n"
        f"gcp: {{project: tpuft-bench, zone: us-central2-b, tpu_api_endpoint: "
        f"'{server.endpoint}'{multislice}}}\n"
        f"ssh: {{user: {pod.user}, key_file: '{pod.client_key}', port: {pod.port}}}\n"
    )
    subprocess.run(
        [sys.executable, "-m", "tpuft", "create", "-c", str(path), "--yes"],
        check=True,
        capture_output=True,
        cwd=REPO,
        env=ENV,
    )
    return path


def tpuft_exec(cluster: Path, *, agent: bool = False) -> float:
    """One `tpuft exec -- true`; without ``agent`` the connection agent is off (the cold path every time)."""
    return tpuft_exec_measured(cluster, agent=agent)[0]


def tpuft_exec_measured(cluster: Path, *, agent: bool = False) -> tuple[float, int, int]:
    """Wall seconds, peak RSS (kB, from wait4's rusage of that one process) and the most descriptors seen open
    (its /proc/PID/fd, sampled every 50 ms) of one `tpuft exec -- true`."""
    import threading

    env = dict(ENV) if agent else {**ENV, "TPUFT_NO_AGENT": "1"}
    argv = [sys.executable, "-m", "tpuft", "exec", "-c", str(cluster), "--", "true"]
    with tempfile.TemporaryFile() as errors:
        started = time.perf_counter()
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=errors,
            cwd=REPO,
            env=env,
            preexec_fn=shell_descriptor_limit,
        )
        done = threading.Event()
        most = [0]

        def sample() -> None:
            while not done.is_set():
                try:
                    most[0] = max(most[0], len(os.listdir(f"/proc/{proc.pid}/fd")))
                except OSError:
                    pass
                done.wait(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        done.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            errors.seek(0)
            raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {errors.read().decode()[-3000:]}")
    return wall, usage.ru_maxrss, most[0]


def shell_descriptor_limit() -> None:
    """A login shell's usual soft limit of 1,024 open files (this machine's is higher): at 1,024 workers tpuft
    must raise it itself, as it would have to on a user's laptop."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(
        resource.RLIMIT_NOFILE, (1024 if hard == resource.RLIM_INFINITY else min(1024, hard), hard)
    )


def agent_usage(cluster: Path) -> tuple[int, int, int]:
    """The running agent's peak RSS and RSS now (kB, /proc/PID/status VmHWM and VmRSS) and its open
    descriptors."""
    answer = agent_call("ping", cluster)
    if not isinstance(answer, dict):
        raise RuntimeError("the connection agent does not answer")
    pid = answer["pid"]
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return (
        int(status["VmHWM"].split()[0]),
        int(status["VmRSS"].split()[0]),
        len(os.listdir(f"/proc/{pid}/fd")),
    )


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


def warm_agent(cluster: Path, workers: int = 1) -> None:
    """Run once with the agent on (the cold run starts it in the background) and wait until it answers (it
    connects to every worker first: on this loaded 2-core machine that can take minutes at 1,024)."""
    tpuft_exec(cluster, agent=True)
    deadline = time.monotonic() + 120 + 0.5 * workers
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
        # reads every slice's node, publishes the key, pins every slice's host keys
        first = tpuft_exec(cluster)
        ssh_parallel(pod, slices * hosts)
        cold = [tpuft_exec(cluster) for _ in range(runs)]
        warm_agent(cluster, slices * hosts)
        tpuft_exec(cluster, agent=True)
        warm = [tpuft_exec(cluster, agent=True) for _ in range(runs)]
        agent_call("stop", cluster)
        par = [ssh_parallel(pod, slices * hosts) for _ in range(runs)]
        # the next shape reuses the addresses
        subprocess.run(
            [sys.executable, "-m", "tpuft", "delete", "-c", str(cluster), "--yes"],
            check=True,
            capture_output=True,
            cwd=REPO,
            env=ENV,
        )
        rows.append(
            (slices, hosts, first, statistics.median(cold), statistics.median(warm), statistics.median(par))
        )
        console.log(f"{slices} x {hosts} done")
    table = Table(
        title=f"fan-out of `tpuft exec -- true` to every host, one slice against several (median of {runs})"
    )
    for column in (
        "shape",
        "hosts",
        "first exec after create s",
        "tpuft exec s",
        "tpuft exec (warm agent) s",
        "parallel ssh s",
        "exec / parallel",
    ):
        table.add_column(column, justify="right")
    for slices, hosts, first, cold, warm, par in rows:
        table.add_row(
            f"{slices} x {hosts}",
            str(slices * hosts),
            f"{first:.3f}",
            f"{cold:.3f}",
            f"{warm:.3f}",
            f"{par:.3f}",
            f"{cold / par:.2f}x",
        )
    console.print(table)


def gcloud_env(server, root: Path) -> dict[str, str]:
    """gcloud pointed at the fake TPU API (and at it for the one Compute Engine call, the project's OS Login
    setting)."""
    endpoint = server.endpoint.rstrip("/")
    return rig_gcloud_env(root, "tpuft-bench", tpu_endpoint=endpoint, compute_endpoint=endpoint)


def gcloud_ssh(pod, count: int, env: dict[str, str], worker: str = "all") -> float:
    """`gcloud compute tpus tpu-vm ssh bench-N --worker=all --command=true`: it reads the node and its guest
    attributes (host keys), the project (OS Login), adds its key to the node's metadata if missing, then runs
    one OpenSSH client per worker, all at once (the GA command does not batch)."""
    argv = [
        GCLOUD,
        "compute",
        "tpus",
        "tpu-vm",
        "ssh",
        f"bench-{count}",
        "--zone",
        "us-central2-b",
        f"--worker={worker}",
        "--command=true",
        "--ssh-key-file",
        str(pod.client_key),
        "--strict-host-key-checking=no",
        "--ssh-flag=-p",
        f"--ssh-flag={pod.port}",
        "--ssh-flag=-o",
        "--ssh-flag=LogLevel=ERROR",
        "--quiet",
    ]
    started = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"gcloud failed ({out.returncode}): {out.stderr[-2000:]}")
    return time.perf_counter() - started


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1,16,64,256,1024", help="worker counts (default: %(default)s)")
    parser.add_argument(
        "--runs", type=int, default=3, help="timed runs per column and size (medians; default 3)"
    )
    parser.add_argument(
        "--slow-runs",
        type=int,
        default=0,
        help="runs of the parallel ssh and gcloud columns from "
        "256 workers on, where each takes minutes on this machine (default: --runs)",
    )
    parser.add_argument(
        "--extras-up-to",
        type=int,
        default=64,
        help="measure the secondary columns (tpuft's fleet "
        "alone, a sequential ssh loop, the first output line) only up to this many workers: at 1,024 "
        "a sequential loop alone takes minutes (default: %(default)s)",
    )
    parser.add_argument(
        "--per-sshd",
        type=int,
        default=0,
        help="workers per sshd process (1..16; default: 1 up to 64 "
        "workers, else 16; see tests/rigs/sshd_pod.py)",
    )
    parser.add_argument(
        "--gcloud",
        choices=("auto", "on", "off"),
        default="auto",
        help="time `gcloud compute tpus tpu-vm ssh --worker=all` too (auto: if /usr/bin/gcloud exists)",
    )
    parser.add_argument(
        "--json", action="store_true", help="also print the rows as JSON (one line) after the table"
    )
    parser.add_argument(
        "--markdown",
        action="store_true",
        help="also print the main columns as a Markdown table (what docs/benchmarks.md shows)",
    )
    parser.add_argument(
        "--shapes",
        default="",
        help="SLICESxHOSTS,... (e.g. 1x64,4x16): compare multislice shapes of "
        "the same hosts instead of the sizes",
    )
    parser.add_argument(
        "--login",
        choices=("machine", "stock"),
        default="machine",
        help="machine: the workers' sessions run this machine's login shell as it is (root's "
        "~/.bashrc: pyenv init, about 0.1 CPU-second each, on the client's cores); stock: the shell "
        "skips ~/.bashrc, as a stock TPU VM image's non-interactive shells effectively do",
    )
    args = parser.parse_args()
    from rich.console import Console

    from tests.rigs.fake_tpu import FakeTpuServer
    from tests.rigs.gcs_emulator import GcsEmulator
    from tests.rigs.sshd_pod import SshdPod

    # A sandbox that sets PYTHONDONTWRITEBYTECODE makes every tpuft process compile its modules from source
    # (about 70 ms a start); an installed tpuft has its bytecode cached, which is what a user's `tpuft exec`
    # runs with.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    shapes = [tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(",") if shape]
    sizes = (
        [slices * hosts for slices, hosts in shapes] if shapes else [int(s) for s in args.sizes.split(",")]
    )
    unknown = sorted(({hosts for _, hosts in shapes} if shapes else set(sizes)) - set(ACCELERATOR_FOR_HOSTS))
    if unknown:
        parser.error(f"no TPU slice type here has {unknown} hosts; sizes: {sorted(ACCELERATOR_FOR_HOSTS)}")
    per_sshd = args.per_sshd or (1 if max(sizes) <= 64 else 16)
    use_gcloud = args.gcloud == "on" or (args.gcloud == "auto" and Path(GCLOUD).exists())
    console = Console(width=200)
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        SshdPod(
            Path(tmp) / "pod",
            workers=max(sizes),
            stock_login=args.login == "stock",
            addresses_per_sshd=per_sshd,
        ) as pod,
        FakeTpuServer(operation_polls=0) as server,
        GcsEmulator() as gcs,
    ):
        server.worker_addresses = pod.addresses
        server.host_keys.update(pod.host_keys)  # the workers' host keys, as the API publishes them
        ENV.update(
            {**os.environ, **gcs.env(), "TPUFT_HOME": str(Path(tmp) / "home"), "TPUFT_AGENT_IDLE_S": "600"}
        )
        ENV.pop("TPUFT_NO_AGENT", None)
        if shapes:
            compare_shapes(pod, server, shapes, args.runs, Path(tmp), console)  # type: ignore[arg-type]
            return
        genv = gcloud_env(server, Path(tmp)) if use_gcloud else {}
        console.log(f"{max(sizes)} workers on {pod.sshd_count} sshd processes ({per_sshd} per sshd)")
        for count in sizes:
            row = measure(pod, count, Path(tmp), args, genv, server, console)
            rows.append(row)
            console.log(f"{count} workers done: {json.dumps(row)}")  # a run cut short still leaves its rows
    rows.sort(key=lambda row: row["workers"])
    print_table(console, rows, args, per_sshd)
    if args.markdown:
        print(markdown_table(rows))
    if args.json:
        print(json.dumps(rows))


def measure(pod, count: int, root: Path, args, genv: dict[str, str], server, console) -> dict:
    """Every column for ``count`` workers, each after a warm-up of its own."""
    extras = count <= args.extras_up_to
    cluster = tpuft_exec_cluster(pod, server, count, root)
    tpuft_exec(cluster)  # warm-up; also publishes the key in the node metadata once
    # warm-up (page cache, sshd host key loads; tpuft's warm-up reached them all)
    ssh_parallel(pod, min(count, 64))
    if genv:
        # warm-up: gcloud adds its key to the node's metadata the first time
        gcloud_ssh(pod, count, genv, "0")
    slow = args.slow_runs if args.slow_runs and count >= 256 else args.runs
    cold: list[tuple[float, int, int]] = []
    par: list[float] = []
    gcl: list[float] = []
    for run in range(
        max(args.runs, slow)
    ):  # interleaved: a burst of load from elsewhere hits every column alike
        if run < args.runs:
            cold.append(tpuft_exec_measured(cluster))
        if run < slow:
            par.append(ssh_parallel(pod, count))
            if genv:
                gcl.append(gcloud_ssh(pod, count, genv))
    console.log(
        f"{count} workers: cold {[round(c[0], 3) for c in cold]}, parallel ssh {[round(p, 3) for p in par]}, "
        f"gcloud {[round(g, 3) for g in gcl]}"
    )
    warm_agent(cluster, count)
    tpuft_exec(cluster, agent=True)  # warm-up of the warm path itself
    warm = [tpuft_exec(cluster, agent=True) for _ in range(args.runs)]
    agent_peak, agent_rss, agent_fds = agent_usage(cluster)
    agent_call("stop", cluster)  # its connections would share the cores with the other columns
    row = {
        "workers": count,
        "tpuft_exec": statistics.median(c[0] for c in cold),
        "tpuft_exec_warm": statistics.median(warm),
        "parallel_ssh": statistics.median(par),
        "gcloud": median(gcl),
        "controller_rss_mb": max(c[1] for c in cold) / 1024,
        "controller_fds": max(c[2] for c in cold),
        "agent_rss_mb": agent_peak / 1024,
        "agent_rss_now_mb": agent_rss / 1024,
        "agent_fds": agent_fds,
    }
    if extras:
        tp = [tpuft_fanout(pod, count, ["true"]) for _ in range(args.runs)]
        row.update(
            {
                "tpuft": statistics.median(t["wall"] for t in tp),
                "cpu_per_worker": statistics.median(t["cpu"] for t in tp) / count,
                "sequential_ssh": statistics.median(ssh_sequential(pod, count) for _ in range(args.runs)),
                "first_line": statistics.median(
                    tpuft_fanout(pod, count, ["echo", "hi"])["first_line"] for _ in range(args.runs)
                ),
            }
        )
    # the next size reuses the addresses
    subprocess.run(
        [sys.executable, "-m", "tpuft", "delete", "-c", str(cluster), "--yes"],
        check=True,
        capture_output=True,
        cwd=REPO,
        env=ENV,
    )
    return row


def markdown_table(rows: list[dict]) -> str:
    def cell(value: float | None, unit: str = "") -> str:
        return "—" if value is None else f"{value:.2f}{unit}"

    lines = [
        "| workers | tpuft, warm agent | tpuft, cold | parallel ssh | gcloud | cold / ssh | cold / gcloud | "
        "controller peak RSS, fds | agent RSS, fds |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        by_ssh = row["tpuft_exec"] / row["parallel_ssh"]
        by_gcloud = None if row["gcloud"] is None else row["tpuft_exec"] / row["gcloud"]
        lines.append(
            f"| {row['workers']:,} | {cell(row['tpuft_exec_warm'])} | {cell(row['tpuft_exec'])} "
            f"| {cell(row['parallel_ssh'])} | {cell(row['gcloud'])} | {cell(by_ssh, '×')} "
            f"| {cell(by_gcloud, '×')} | {row['controller_rss_mb']:.0f} MB, {row['controller_fds']:,} "
            f"| {row['agent_rss_mb']:.0f} MB, {row['agent_fds']:,} |"
        )
    return "\n".join(lines)


def print_table(console, rows: list[dict], args, per_sshd: int) -> None:
    from rich.table import Table

    def seconds(value: float | None) -> str:
        return "—" if value is None else f"{value:.3f}"

    def ratio(a: float | None, b: float | None) -> str:
        return "—" if a is None or b is None else f"{a / b:.2f}x"

    runs = f"{args.runs}" + (f", of {args.slow_runs} for ssh and gcloud from 256" if args.slow_runs else "")
    table = Table(
        title=f"fan-out: `true` on N loopback sshd workers ({per_sshd} per sshd; median of {runs}, "
        f"after a warm-up; --login {args.login}; — = not measured at this size)"
    )
    for column in (
        "workers",
        "warm agent s",
        "cold s",
        "parallel ssh s",
        "gcloud s",
        "cold/ssh",
        "cold/gcloud",
        "warm/ssh",
        "ctl RSS MB",
        "ctl fds",
        "agent RSS MB",
        "agent fds",
        "fleet s",
        "seq ssh s",
        "fleet CPU ms/w",
        "1st line s",
    ):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            str(row["workers"]),
            seconds(row["tpuft_exec_warm"]),
            seconds(row["tpuft_exec"]),
            seconds(row["parallel_ssh"]),
            seconds(row["gcloud"]) if args.gcloud != "off" else "off",
            ratio(row["tpuft_exec"], row["parallel_ssh"]),
            ratio(row["tpuft_exec"], row["gcloud"]),
            ratio(row["tpuft_exec_warm"], row["parallel_ssh"]),
            f"{row['controller_rss_mb']:.0f}",
            str(row["controller_fds"]),
            f"{row['agent_rss_mb']:.0f}",
            str(row["agent_fds"]),
            seconds(row.get("tpuft")),
            seconds(row.get("sequential_ssh")),
            "—" if "cpu_per_worker" not in row else f"{row['cpu_per_worker'] * 1000:.1f}",
            seconds(row.get("first_line")),
        )
    console.print(table)
    by = {row["workers"]: row for row in rows}
    said = []
    if 1 in by:
        said.append(f"cold N=1 {by[1]['tpuft_exec'] / by[1]['parallel_ssh']:.2f}x one ssh (<= 1.0x)")
    if 64 in by:
        said.append(f"cold N=64 {by[64]['tpuft_exec'] / by[64]['parallel_ssh']:.2f}x parallel ssh (<= 0.3x)")
    big = rows[-1]
    if big["gcloud"] is not None:
        said.append(f"cold N={big['workers']} {big['tpuft_exec'] / big['gcloud']:.2f}x gcloud (<= 0.3x)")
    said.append(
        f"N={big['workers']}: controller {big['controller_rss_mb']:.0f} MB (< 1024), agent "
        f"{big['agent_rss_mb']:.0f} MB (< 2048) holding {big['workers']} connections with {big['agent_fds']} "
        "fds"
    )
    said.append(f"warm N={big['workers']} {big['tpuft_exec_warm'] / big['parallel_ssh']:.2f}x parallel ssh")
    console.print("targets: " + "; ".join(said))


if __name__ == "__main__":
    main()
