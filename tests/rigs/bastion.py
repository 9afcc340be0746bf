"""A bastion (jump host) for testing ``ProxyJump``: one more real OpenSSH server on loopback, configured like
a worker of :mod:`tests.rigs.sshd_pod` (the same config template and ForceCommand wrapper), with its own host
key and its own authorized client key, logging at DEBUG1 to a file.

The log is the proof that a connection went through it: sshd logs every ``direct-tcpip`` request (what a
``ProxyJump`` client asks the bastion for) as ``server_request_direct_tcpip: originator A port P, target T
port N``, and every login as ``Accepted publickey for USER``. The bastion's own client key is not authorized
on the workers and the workers' key is not authorized here, so a test also proves each Host block's
``IdentityFile`` was used.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.rigs.sshd_pod import CONFIG, SSHD, TEST_LIMITS, WRAPPER, _free_port, _keygen

DIRECT_TCPIP = re.compile(r"server_request_direct_tcpip: originator \S* ?port \d+, target (\S+) port (\d+)")


@dataclass
class Bastion:
    """``start()`` returns once it accepts connections; ``stop()`` kills it (and the sessions it forked)."""

    root: Path
    address: str = "127.0.1.201"
    port: int = 0
    user: str = field(default_factory=lambda: os.environ.get("USER") or "root")
    process: subprocess.Popen[bytes] | None = None

    @property
    def host_key(self) -> Path:
        return self.root / "host_key"

    @property
    def client_key(self) -> Path:
        """The only key the bastion accepts (not the workers' key)."""
        return self.root / "client_key"

    @property
    def log(self) -> Path:
        return self.root / "sshd.log"

    def known_hosts_line(self) -> str:
        """The bastion's line for a client's known_hosts (``[address]:port`` as OpenSSH writes it off port
        22)."""
        kind, blob = Path(f"{self.host_key}.pub").read_text().split()[:2]
        return f"[{self.address}]:{self.port} {kind} {blob}\n"

    def start(self, timeout: float = 30.0) -> Bastion:
        self.root.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        for key in (self.host_key, self.client_key):
            if not key.exists():
                _keygen(key)
        (self.root / "authorized_keys").write_text(Path(f"{self.client_key}.pub").read_text())
        wrapper = self.root / "wrapper.sh"
        wrapper.write_text(WRAPPER.format(home=f"export HOME={self.root / 'home'}"))
        wrapper.chmod(0o755)
        self.port = self.port or _free_port([self.address])
        config = self.root / "sshd.conf"
        # sshd keeps the first value it reads for a keyword: this LogLevel wins over the template's ERROR.
        config.write_text(
            "LogLevel DEBUG1\n"
            + CONFIG.format(
                listen=f"ListenAddress {self.address}:{self.port}\n",
                limits=TEST_LIMITS,
                host_key=self.host_key,
                pid_file=self.root / "sshd.pid",
                authorized_keys=self.root / "authorized_keys",
                wrapper=wrapper,
            )
        )
        self.process = subprocess.Popen(
            [SSHD, "-D", "-E", str(self.log), "-f", str(config)],
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while True:
            with socket.socket() as probe:
                probe.settimeout(0.2)
                if probe.connect_ex((self.address, self.port)) == 0:
                    return self
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the bastion's sshd exited with {self.process.returncode}; see {self.log}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the bastion's sshd is not listening on {self.address}:{self.port} after {timeout}s"
                )
            time.sleep(0.05)

    def forwarded(self) -> list[tuple[str, int]]:
        """(address, port) of every direct-tcpip channel a client asked this bastion for, in log order."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return [(match.group(1), int(match.group(2))) for match in DIRECT_TCPIP.finditer(text)]

    def logins(self) -> int:
        """How many SSH logins the bastion accepted."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text.count("Accepted publickey for ")

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def __enter__(self) -> Bastion:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
