"""Pacing of SSH handshakes (tpuft/fleet/pacing.py): what counts as sshd refusing a handshake, how soon that
is retried, the per-server bound, and the descriptor limit a 1,024-worker fleet needs."""

from __future__ import annotations

import resource
import subprocess
import sys
import threading
import time

import paramiko
import pytest

from tpuft.fleet.pacing import (
    DESCRIPTORS_PER_WORKER,
    REFUSED_DELAY_MAX_S,
    HandshakeGate,
    ensure_descriptors,
    refused_before_banner,
    retry_delay,
)


def test_a_handshake_dropped_before_the_banner_is_retried_soon_with_jitter() -> None:
    banner = paramiko.SSHException("Error reading SSH protocol banner[Errno 104] Connection reset by peer")
    assert (
        refused_before_banner(banner)
        and refused_before_banner(ConnectionResetError())
        and refused_before_banner(EOFError())
    )
    delays = [retry_delay(banner, attempt, 5.0) for attempt in (1, 1, 1, 2, 3, 8)]
    assert all(0.1 <= d <= 0.2 for d in delays[:3]) and len(set(delays[:3])) == 3  # spread out, not one wave
    assert 0.2 <= delays[3] <= 0.4 and 0.4 <= delays[4] <= 0.8
    assert REFUSED_DELAY_MAX_S / 2 <= delays[5] <= REFUSED_DELAY_MAX_S
    assert retry_delay(banner, 9, 0.5) <= 0.5  # never longer than the cluster file's delay


def test_anything_else_waits_the_configured_delay() -> None:
    for error in (
        ConnectionRefusedError(111, "Connection refused"),
        TimeoutError("timed out"),
        OSError(113, "No route"),
    ):
        assert not refused_before_banner(error)
        assert retry_delay(error, 1, 5.0) == 5.0


def test_handshakes_to_one_server_are_bounded_and_others_go_on() -> None:
    gate = HandshakeGate(per_server=2)
    lock = threading.Lock()
    busy = {"a": 0, "b": 0}
    peak = {"a": 0, "b": 0}

    def handshake(server: str) -> None:
        with gate.handshake(server):
            with lock:
                busy[server] += 1
                peak[server] = max(peak[server], busy[server])
            time.sleep(0.02)
            with lock:
                busy[server] -= 1

    threads = [threading.Thread(target=handshake, args=(server,)) for server in "aaaaaab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert peak == {"a": 2, "b": 1}


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one_when_a_fleet_needs_it() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024 * DESCRIPTORS_PER_WORKER + 512:
        pytest.skip(f"hard limit {hard} is below what the test lowers the soft limit from")
    resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))
    try:
        assert ensure_descriptors(8) == (512, hard)  # enough already: left alone
        raised, _ = ensure_descriptors(1024)
        assert raised == (hard if hard != resource.RLIM_INFINITY else 1024 * DESCRIPTORS_PER_WORKER + 256)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == raised
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_retried_handshake_prints_no_paramiko_traceback() -> None:
    """paramiko logs a dropped handshake with its traceback, which Python prints on stderr when nobody set up
    logging (the CLI): after the fleet quiets it, nothing reaches stderr; logging set up by a program still
    gets it."""
    script = (
        "import logging, sys\n"
        "from tpuft.fleet.pacing import quiet_handshake_tracebacks\n"
        "if sys.argv[1] == 'quiet': quiet_handshake_tracebacks(); quiet_handshake_tracebacks()\n"
        "logging.getLogger('paramiko.transport').error('Exception (client): Error reading SSH protocol "
        "banner')\n"
        "print(len(logging.getLogger('paramiko').handlers))\n"
    )
    loud = subprocess.run([sys.executable, "-c", script, "loud"], capture_output=True, text=True, check=True)
    quiet = subprocess.run(
        [sys.executable, "-c", script, "quiet"], capture_output=True, text=True, check=True
    )
    assert "Error reading SSH protocol banner" in loud.stderr
    assert quiet.stderr == "" and quiet.stdout.strip() == "1"


def test_many_unreachable_workers_are_named_in_spans() -> None:
    """1,024 workers behind a dead network: ten in full, the rest as --worker spans, not a thousand lines."""
    from tpuft.fleet.ssh_config import SshConnectError
    from tpuft.fleet.ssh_progress import unreachable

    failures = {
        i: SshConnectError(
            f"worker {i} (10.0.0.{i % 250}:22): cannot connect over SSH after 10 attempts",
            hint="Check the firewall.",
        )
        for i in [*range(0, 500), *range(501, 1024)]
    }
    error = unreachable(failures, 1024)
    lines = error.message.splitlines()
    assert lines[0] == "1023 of 1024 workers cannot be reached over SSH:"
    assert (
        lines[1] == "  worker 0 (10.0.0.0:22): cannot connect over SSH after 10 attempts" and len(lines) == 12
    )
    assert lines[-1] == "  ... and 1013 more: workers 10-499,501-1023"
    assert error.hint == "Check the firewall."
    one = {7: SshConnectError("worker 7 (10.0.0.7:22): refused", hint="h")}
    assert unreachable(one, 8) is one[7]
