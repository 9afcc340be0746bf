"""The doctor's port probe against real sockets of this machine: what holds the coordinator's port, and the
remains of a run that just ended, which must not refuse a relaunch."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

from tpuft.core.ports import free_port
from tpuft.host.doctor_probe import port_state


def _time_wait_on(port: int) -> None:
    """A connection whose server end closed first, from a listener without SO_REUSEADDR: its end stays in
    TIME_WAIT on ``port`` for a minute after every socket is closed, the remains of a coordinator that
    ended."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen(1)
        client = socket.create_connection(("127.0.0.1", port))
        served, _ = listener.accept()
        served.close()  # the server closes first: its end goes to TIME_WAIT
        client.recv(1)
        client.close()


def test_the_remains_of_an_ended_coordinator_are_asked_again_and_then_named() -> None:
    port = free_port()
    _time_wait_on(port)
    started = time.monotonic()
    state = port_state(port, settle_s=1.5)
    assert time.monotonic() - started >= 1.5
    assert state["free"] is False and state["listeners"] == [] and state["lingering"] == ["TIME_WAIT"], state
    assert state["waited_s"] >= 1.5


def test_remains_that_go_away_while_asked_leave_the_port_free() -> None:
    port = free_port()
    held = socket.socket()  # bound, not listening, not reusable: refuses the probe's bind; no process listens
    held.bind(("127.0.0.1", port))
    threading.Timer(1.0, held.close).start()
    assert port_state(port, settle_s=20)["free"] is True


def test_a_live_listener_is_named_at_once() -> None:
    port = free_port()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, sys, time; s = socket.socket(); "
            f"s.bind(('127.0.0.1', {port})); s.listen(1); print('up', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "up"
        started = time.monotonic()
        state = port_state(port, settle_s=20)
    finally:
        holder.kill()
        holder.wait()
    assert time.monotonic() - started < 5 and state["free"] is False
    assert [p["pid"] for p in state["listeners"]] == [holder.pid], state


def test_the_reachability_listener_and_connector_say_reached_refused_and_done(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tpuft.host import doctor_probe

    ports = [free_port(), free_port()]
    # the firewall stand-in: that port stays closed
    monkeypatch.setenv(doctor_probe.SKIP_LISTEN_ENV, str(ports[1]))
    heard: list[dict[str, object]] = []
    listener = threading.Thread(target=lambda: heard.append(doctor_probe.listen(ports, expect=2, seconds=30)))
    listener.start()
    addresses = [f"127.0.0.1:{p}" for p in ports]
    deadline = time.monotonic() + 10
    while doctor_probe.connect(addresses[:1], 1.0)["reach"][0]["ok"] is False and time.monotonic() < deadline:
        time.sleep(0.05)  # until it listens (that first connection counts as one of the two expected)
    assert doctor_probe.connect(addresses, 1.0)["reach"] == [
        {"address": addresses[0], "ok": True},
        {"address": addresses[1], "ok": False, "error": "refused"},
    ]
    listener.join(5)  # its two connections came: it ends by itself
    assert not listener.is_alive() and heard == [{"accepted": {str(ports[0]): 2}, "bind_errors": {}}]
    waiting = threading.Thread(
        target=lambda: heard.append(doctor_probe.listen(ports[:1], expect=5, seconds=30))
    )
    waiting.start()
    while (
        doctor_probe.connect(addresses[:1], 1.0, doctor_probe.DONE)["reach"][0]["ok"] is False
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    waiting.join(5)  # told it is done: it does not wait out its 30 s for connections that will not come
    assert not waiting.is_alive() and heard[1] == {"accepted": {str(ports[0]): 0}, "bind_errors": {}}
