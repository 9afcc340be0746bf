"""The per-cluster connection agent (tpuft/ops/agent.py) against real OpenSSH servers and the fake TPU API: a
second `tpuft exec` reuses the agent's connections, prints and exits exactly like the cold path (failures,
fail-fast, Ctrl-C), and anything wrong with the agent (killed, a stale or lying socket, a recreated node,
idle) means the cold path, never a wrong answer."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import alive, default_sigint, wait_for_files
from tests.ops.argv_watch import ArgvWatch
from tests.rigs.fake_tpu import FakeTpuServer
from tests.rigs.gcs_emulator import GcsEmulator
from tests.rigs.sshd_pod import SshdPod, sshd_available

pytestmark = pytest.mark.skipif(not sshd_available(), reason="needs openssh-server (.ci/run installs it)")

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Rig:
    tpu: FakeTpuServer
    pod: SshdPod
    cluster: Path
    env: dict[str, str]
    """The environment of a user with an agent (TPUFT_NO_AGENT unset)."""

    @property
    def cold_env(self) -> dict[str, str]:
        return {**self.env, "TPUFT_NO_AGENT": "1"}

    def tpuft(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tpuft", *args],
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
        )

    def exec(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return self.tpuft("exec", "-c", str(self.cluster), *args, env=env)

    def client(self, what: str) -> object:
        """Ask the agent client (in this process, with the rig's environment) ``ping`` or ``stop``."""
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(self.env)
        try:
            from tpuft.ops import agent_client

            return getattr(agent_client, what)(str(self.cluster))
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def ping(self) -> dict | None:  # type: ignore[type-arg]
        return self.client("ping")  # type: ignore[return-value]

    def wait_agent(self, timeout: float = 20, other_than: int | None = None) -> dict:  # type: ignore[type-arg]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            answer = self.ping()
            if answer is not None and answer.get("pid") != other_than:
                return answer
            time.sleep(0.1)
        logs = "\n".join(p.read_text() for p in self.agents.glob("*.log"))
        raise AssertionError(f"no agent answered within {timeout} s; agent logs:\n{logs}")

    @property
    def agents(self) -> Path:
        return Path(self.env["TPUFT_HOME"]) / "agents"

    def stop_agent(self) -> None:
        """Stop this rig's agents, those still starting in the background included (by their pids)."""
        answer = self.ping()
        self.client("stop")
        if answer is not None:
            wait_gone(answer["pid"])
        for pid in agent_pids(self.cluster):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            wait_gone(pid)


def agent_pids(cluster: Path) -> list[int]:
    """The agent processes started for ``cluster`` (found by their command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"tpuft.ops.agent" in argv and str(cluster).encode() in argv and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def wait_gone(pid: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.05)
    assert not alive(pid), f"agent {pid} still alive"


def write_cluster(path: Path, tpu: FakeTpuServer, pod: SshdPod) -> None:
    path.write_text(
        f"name: agent-test\nprovider: gcp\naccelerator: v4-32\nbucket: gs://agent-bucket\n"
        f"gcp: {{project: tpuft-test, zone: us-central2-b, tpu_api_endpoint: '{tpu.endpoint}'}}\n"
        f"ssh: {{user: {pod.user}, key_file: '{pod.client_key}', port: {pod.port}, ssh_config: "
        f"'{path.parent / 'ssh_config'}'}}\n"
    )


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    root = tmp_path_factory.mktemp("agent")
    with (
        FakeTpuServer(operation_polls=0) as tpu,
        SshdPod(root / "pod", workers=4) as pod,
        GcsEmulator() as gcs,
    ):
        tpu.worker_addresses = pod.addresses
        tpu.host_keys.update(pod.host_keys)  # the workers' host keys, as the API publishes them
        cluster = root / "tpuft.yaml"
        write_cluster(cluster, tpu, pod)
        env = {
            **os.environ,
            **gcs.env(),
            "TPUFT_HOME": str(root / "home"),
            "COLUMNS": "200",
            "TPUFT_AGENT_IDLE_S": "60",
        }
        env.pop("TPUFT_NO_AGENT", None)
        env.pop("TPUFT_CONFIG", None)
        made = Rig(tpu, pod, cluster, env)
        created = made.tpuft("create", "-c", str(cluster), "--yes", env=made.cold_env)
        assert created.returncode == 0, created.stderr
        try:
            yield made
        finally:
            made.stop_agent()


@pytest.fixture
def fresh(rig: Rig) -> Iterator[Rig]:
    """The rig with no agent running at the start and none left at the end."""
    rig.stop_agent()
    yield rig
    rig.stop_agent()


def agent_connections(pod: SshdPod) -> set[int]:
    return set(pod.sessions())


def test_the_second_exec_reuses_the_agents_connections(fresh: Rig) -> None:
    rig = fresh
    first = rig.exec("--", "echo hi from $TPUFT_WORKER_ID")
    assert first.returncode == 0, first.stderr
    assert sorted(first.stdout.splitlines()) == [f"[w{i}] hi from {i}" for i in range(4)]
    agent = rig.wait_agent()  # started in the background by the cold run
    assert agent["fleets_made"] == 1 and agent["workers"] == 4
    before = agent_connections(rig.pod)
    assert len(before) == 4  # one sshd per worker: the agent's connections (the cold run's are closed)
    for _ in range(3):
        again = rig.exec("--", "echo hi from $TPUFT_WORKER_ID")
        assert again.returncode == 0 and sorted(again.stdout.splitlines()) == sorted(
            first.stdout.splitlines()
        )
    after = rig.ping()
    assert after is not None and after["pid"] == agent["pid"]
    assert after["requests"] == agent["requests"] + 3 and after["fleets_made"] == 1
    assert agent_connections(rig.pod) == before  # no handshake happened: the same sshd connection processes


CASES = [
    ["--", "echo id=$TPUFT_WORKER_ID of $TPUFT_NUM_WORKERS"],
    ["-w", "1,3", "--", "echo", "one", "two"],
    ["--", 'if [ "$TPUFT_WORKER_ID" = 1 ]; then echo oops; exit 4; fi; sleep 5'],
    # worker 2 fails a moment after printing, so that fail-fast (which stops the others within milliseconds
    # since the connections say TCP_NODELAY) finds every worker past its two lines, cold or warm
    ["--", 'echo out; echo err >&2; if [ "$TPUFT_WORKER_ID" = 2 ]; then sleep 0.5; exit 3; fi; sleep 5'],
    ["--worker", "7", "--", "true"],
    ["-w", "x", "--", "true"],
    [
        "-w",
        "0:1-2,0:0",
        "--",
        "echo slice $TPUFT_WORKER_ID",
    ],  # S:I on one slice: slice 0 (1:0 is refused as 7 is)
]


def test_the_warm_path_prints_and_exits_like_the_cold_path(fresh: Rig) -> None:
    rig = fresh
    assert rig.exec("--", "true").returncode == 0
    agent = rig.wait_agent()
    for args in CASES:
        cold = rig.exec(*args, env=rig.cold_env)
        warm = rig.exec(*args)
        assert warm.returncode == cold.returncode, (args, warm.stderr, cold.stderr)
        assert sorted(warm.stdout.splitlines()) == sorted(cold.stdout.splitlines()), args
        assert warm.stderr == cold.stderr, args
    assert rig.exec(*CASES[2]).stderr.startswith(
        "error: the command failed on worker 1 (exit code 4)\nstopped the other"
    )
    served = rig.ping()
    assert served is not None and served["pid"] == agent["pid"]
    assert served["requests"] - agent["requests"] == 6  # the bad worker specs went the cold way
    # no `--`: the Typer command
    typer = rig.tpuft("exec", "-c", str(rig.cluster), "echo typer $TPUFT_WORKER_ID")
    assert typer.returncode == 0 and sorted(typer.stdout.split("\n")[:-1]) == [
        f"[w{i}] typer {i}" for i in range(4)
    ]
    assert rig.ping()["requests"] == served["requests"] + 1  # type: ignore[index]


def test_a_killed_agent_a_stale_socket_and_a_lying_one_fall_back(fresh: Rig) -> None:
    rig = fresh
    assert rig.exec("--", "true").returncode == 0
    agent = rig.wait_agent()
    sockets = list(rig.agents.glob("*.sock"))
    assert len(sockets) == 1
    os.kill(agent["pid"], signal.SIGKILL)
    wait_gone(agent["pid"])
    assert sockets[0].exists()  # a stale socket file: nobody listens
    result = rig.exec("--", "echo still $TPUFT_WORKER_ID")
    assert result.returncode == 0 and sorted(result.stdout.splitlines()) == [
        f"[w{i}] still {i}" for i in range(4)
    ]
    replacement = rig.wait_agent(other_than=agent["pid"])  # and the cold run started a new one
    rig.stop_agent()

    liar = socket.socket(socket.AF_UNIX)  # something else listens on the agent's socket and answers nonsense
    sockets[0].unlink(missing_ok=True)
    liar.bind(str(sockets[0]))
    liar.listen()

    def answer_badly() -> None:
        while True:
            try:
                conn, _ = liar.accept()
            except OSError:
                return
            conn.sendall(b"\x00garbage{\n")
            conn.close()

    threading.Thread(target=answer_badly, daemon=True).start()
    try:
        result = rig.exec("--", "echo fine $TPUFT_WORKER_ID")
        assert result.returncode == 0 and sorted(result.stdout.splitlines()) == [
            f"[w{i}] fine {i}" for i in range(4)
        ]
    finally:
        liar.close()
    assert replacement["pid"] != agent["pid"]


def test_an_idle_agent_ends_itself(fresh: Rig) -> None:
    rig = fresh
    env = {**rig.env, "TPUFT_AGENT_IDLE_S": "1"}
    assert rig.exec("--", "true", env=env).returncode == 0
    agent = rig.wait_agent()
    started = time.monotonic()
    wait_gone(agent["pid"], timeout=15)
    assert time.monotonic() - started < 10
    assert list(rig.agents.glob("*.sock")) == []  # it took its socket with it
    deadline = time.monotonic() + 5
    while agent_connections(rig.pod) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert agent_connections(rig.pod) == set()  # and its connections


CTRL_C = "sleep 300 & echo $! > child.pid; echo $$ > shell.pid; wait"


def test_ctrl_c_through_the_agent_stops_the_remote_commands(fresh: Rig) -> None:
    rig = fresh
    assert rig.exec("--", "true").returncode == 0
    agent = rig.wait_agent()
    files = [rig.pod.home(i) / name for i in range(4) for name in ("child.pid", "shell.pid")]
    for path in files:
        path.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpuft", "exec", "-c", str(rig.cluster), "--", CTRL_C],
        env=rig.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
        cwd=REPO,
    )
    wait_for_files(files)
    pids = [int(p.read_text()) for p in files]
    assert all(alive(pid) for pid in pids)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert (
        err == "interrupted: interrupted during the command: stopped the processes of worker(s) 0, 1, 2, 3\n"
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.1)
    assert [pid for pid in pids if alive(pid)] == []
    served = rig.ping()
    assert served is not None and served["pid"] == agent["pid"]  # the agent served it, and is still fine
    assert served["requests"] == agent["requests"] + 1


def test_a_recreated_cluster_does_not_reach_the_old_agent(fresh: Rig, tmp_path: Path) -> None:
    rig = fresh
    assert rig.exec("--", "true").returncode == 0
    old = rig.wait_agent()
    with SshdPod(tmp_path / "pod", workers=4, first_address=40, port=rig.pod.port) as other:
        # same key
        other.root.joinpath("authorized_keys").write_text(Path(f"{rig.pod.client_key}.pub").read_text())
        for i in range(4):
            other.home(i).mkdir(parents=True, exist_ok=True)
            (other.home(i) / "where").write_text("new node\n")
        rig.tpu.worker_addresses = other.addresses
        rig.tpu.host_keys.update(other.host_keys)
        try:
            assert rig.tpuft("delete", "-c", str(rig.cluster), "--yes", env=rig.cold_env).returncode == 0
            created = rig.tpuft("create", "-c", str(rig.cluster), "--yes", env=rig.cold_env)
            assert created.returncode == 0, created.stderr
            result = rig.exec("--", "cat where")
            assert result.returncode == 0, result.stderr
            assert sorted(result.stdout.splitlines()) == [f"[w{i}] new node" for i in range(4)]
            wait_gone(old["pid"])  # the old agent saw its workers go and ended
            new = rig.wait_agent()
            assert new["pid"] != old["pid"]
            assert rig.exec("--", "cat where").stdout.count("new node") == 4
        finally:
            rig.stop_agent()
            rig.tpu.worker_addresses = rig.pod.addresses
            assert rig.tpuft("delete", "-c", str(rig.cluster), "--yes", env=rig.cold_env).returncode == 0
            assert rig.tpuft("create", "-c", str(rig.cluster), "--yes", env=rig.cold_env).returncode == 0


def test_an_edited_ssh_config_or_another_node_does_not_reach_the_old_agent(fresh: Rig) -> None:
    """The agent's connections were made under the ssh client config and pins of their time: once the config
    file changes (a new ProxyJump, another IdentityFile), the next exec must not reach them, and the old agent
    ends."""
    rig = fresh
    ssh_config = rig.cluster.parent / "ssh_config"
    ssh_config.write_text("# no Host blocks yet\n")
    try:
        assert rig.exec("--", "true").returncode == 0
        old = rig.wait_agent()
        # matches no worker: same workers reached
        ssh_config.write_text("Host 203.0.113.*\n    User someone-else\n")
        # the client's agent id changed: the old socket is not this cluster's any more
        assert rig.ping() is None
        result = rig.exec("--", "echo still")
        assert result.returncode == 0 and result.stdout.count("still") == 4, result.stderr
        wait_gone(old["pid"])  # the old agent saw the file change and ended
        assert rig.wait_agent()["pid"] != old["pid"]
    finally:
        rig.stop_agent()  # while the client still names it: stopped cleanly, its socket removed
        ssh_config.unlink(missing_ok=True)
    # A node recreated under the same name on the same addresses is another node: its id is part of the
    # agent's.
    from tpuft.ops import agent_client

    pointer = {"settings": "s", "files": [str(ssh_config)]}
    record = {"workers": [[0, "10.0.0.2", "10.0.0.2"]], "nodes": [["n", "1", 1]]}
    again = {**record, "nodes": [["n", "2", 1]]}
    assert agent_client.agent_id_of("k", pointer, record) != agent_client.agent_id_of("k", pointer, again)


def test_turned_off_no_agent_starts(fresh: Rig) -> None:
    rig = fresh
    assert rig.exec("--", "true", env=rig.cold_env).returncode == 0
    time.sleep(1)
    assert rig.ping() is None
    assert not rig.agents.exists() or list(rig.agents.glob("*.sock")) == []


def as_nobody(sock: Path) -> str:
    """Connect to ``sock`` and send a ping as user ``nobody`` (a forked child); what happened, in a word."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery from here on
        os.close(read)
        word = b"answered"
        try:
            # as root: only the agents folder's own permissions count, not the test's tmp dirs
            os.chdir(sock.parent)
            os.setgid(65534)
            os.setuid(65534)
            client = socket.socket(socket.AF_UNIX)
            client.settimeout(5)
            client.connect(sock.name)
            client.sendall(b'{"v": 1, "op": "ping"}\n')
            if not client.recv(1000):
                word = b"closed"
        except PermissionError:
            word = b"refused"
        except ConnectionError:  # reset or a broken pipe: it hung up on us
            word = b"closed"
        except Exception as exc:  # noqa: BLE001
            word = type(exc).__name__.encode()
        os.write(write, word)
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as handle:
        return handle.read().decode()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")
def test_another_user_cannot_reach_the_agent(fresh: Rig) -> None:
    rig = fresh
    assert rig.exec("--", "true").returncode == 0
    rig.wait_agent()
    assert (rig.agents.stat().st_mode & 0o777) == 0o700
    sock = next(rig.agents.glob("*.sock"))
    assert (sock.stat().st_mode & 0o777) == 0o600
    assert as_nobody(sock) == "refused"  # the folder and the socket let nobody else in
    # and were they opened up by mistake, the agent checks who is calling (SO_PEERCRED)
    rig.agents.chmod(0o711)
    sock.chmod(0o666)
    try:
        assert as_nobody(sock) == "closed"
    finally:
        sock.chmod(0o600)
        rig.agents.chmod(0o700)
    assert rig.ping() is not None


def test_the_warm_client_imports_nothing_heavy(fresh: Rig) -> None:
    rig = fresh
    assert rig.exec("--", "true").returncode == 0
    rig.wait_agent()
    heavy = ("typer", "rich", "pydantic", "paramiko", "yaml", "tpuft.config")
    code = (
        f"import sys; sys.argv = ['tpuft', 'exec', '-c', {str(rig.cluster)!r}, '--', 'true']\n"
        "from tpuft.launcher import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        f"heavy = [m for m in {heavy!r} if m in sys.modules]\n"
        "print('RESULT=' + __import__('json').dumps([code, heavy]))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=rig.env, capture_output=True, text=True, cwd=REPO)
    line = next(line for line in out.stdout.splitlines() if line.startswith("RESULT="))
    assert json.loads(line.removeprefix("RESULT=")) == [0, []]


def test_the_second_tpuft_ssh_reuses_the_first_connection(fresh: Rig) -> None:
    """`tpuft ssh` is OpenSSH with ControlMaster=auto/ControlPersist: the same TCP connection (the remote sees
    the same client port) serves the second shell."""
    rig = fresh
    # ControlPersist: the master outlives the gap between the two shells, however slow the machine
    env = {
        **rig.env,
        "TPUFT_AGENT_IDLE_S": "20",
    }
    ports = []
    for _ in range(2):
        shell = subprocess.run(
            [sys.executable, "-m", "tpuft", "ssh", "-c", str(rig.cluster), "-w", "2"],
            env=env,
            input='echo "client=$SSH_CLIENT"\nexit\n',
            capture_output=True,
            text=True,
            timeout=30,
            cwd=REPO,
        )
        assert shell.returncode == 0, shell.stderr
        line = next(line for line in shell.stdout.splitlines() if line.startswith("client="))
        ports.append(line.split()[1])
    assert ports[0] == ports[1]
    masters = list(rig.agents.glob("cm-*"))
    assert len(masters) == 1 and (masters[0].stat().st_mode & 0o777) == 0o600
    off = subprocess.run(
        [sys.executable, "-m", "tpuft", "ssh", "-c", str(rig.cluster), "-w", "2"],
        env=rig.cold_env,
        input='echo "client=$SSH_CLIENT"\nexit\n',
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )
    assert off.returncode == 0
    assert next(line for line in off.stdout.splitlines() if line.startswith("client=")).split()[1] != ports[0]


def test_a_stale_memory_of_the_cluster_goes_the_cold_way(fresh: Rig) -> None:
    """The warm path trusts the remembered cluster exactly as long as the cold path does (READY, < 10
    minutes)."""
    rig = fresh
    assert rig.exec("--", "true").returncode == 0
    agent = rig.wait_agent()
    record_path = Path(json.loads(next(rig.agents.glob("*.json")).read_text())["record"])
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps({**record, "time": record["time"] - 3600}))  # an hour-old memory
    result = rig.exec("--", "echo $TPUFT_WORKER_ID")
    assert result.returncode == 0 and len(result.stdout.splitlines()) == 4
    assert rig.ping() is None or rig.ping()["requests"] == agent["requests"]  # type: ignore[index]
    # the cold path asked the API again
    assert json.loads(record_path.read_text())["time"] > record["time"] - 60
    again = rig.wait_agent()
    assert rig.exec("--", "true").returncode == 0
    assert rig.ping()["requests"] == again["requests"] + 1  # type: ignore[index]


def test_the_warm_path_sends_worker_env_as_the_cold_path_does(fresh: Rig) -> None:
    """The cluster file's worker_env reaches a warm ``exec`` too (on the channel's stdin, never in an argv:
    not the agent's, not the commands'); see tests/ops/test_worker_env.py for the cold path and ``setup``."""
    import secrets
    from dataclasses import replace

    marker = f"tpuft-secret-{secrets.token_hex(8)}"
    original = fresh.cluster.read_text()
    fresh.cluster.write_text(original + "worker_env: {MY_SECRET: '${TPUFT_TEST_TOKEN}'}\n")
    rig = replace(fresh, env={**fresh.env, "TPUFT_TEST_TOKEN": marker})  # the agent's name depends on TPUFT_*
    command = 'sleep 1; echo "saw MY_SECRET=$MY_SECRET"'
    expected = [f"[w{i}] saw MY_SECRET={marker}" for i in range(4)]
    try:
        with ArgvWatch(marker, "sleep 1; echo") as watch:
            cold = rig.exec("--", command)
            assert cold.returncode == 0 and sorted(cold.stdout.splitlines()) == expected, cold.stderr
            agent = rig.wait_agent()
            warm = rig.exec("--", command)
            assert warm.returncode == 0 and sorted(warm.stdout.splitlines()) == expected, warm.stderr
        assert rig.ping()["requests"] == agent["requests"] + 1  # type: ignore[index]  # the agent ran it
        assert watch.saw_probe and watch.in_argv == []
    finally:
        rig.stop_agent()
        fresh.cluster.write_text(original)
