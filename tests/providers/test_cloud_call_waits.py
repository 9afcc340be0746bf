"""A call to Google Cloud that gets no answer says what it waits for after 2 s (issue 39, item 6), as tpuft's
other waits do (tpuft/core/waiting.py): which service, at which address, and which call, never before 2 s, and
never another call's service or time. Against loopback ports only: a silent one (accepts, never answers: a
firewall that drops, a dead proxy) for the Cloud TPU API, a closed one (connection refused) for Cloud Storage.

The lower bound is measured by the test itself around the call, so a loaded machine can only make the line
later, never earlier; no upper bound is asserted beyond the line appearing while the call waits."""

from __future__ import annotations

import io
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tpuft.core import waiting as waiting_module
from tpuft.storage.network import CLOCK, CloudUnreachable

EARLIEST_S = 1.5
"""The line must not come before this (the wait's own silence is 2 s; the margin is the test's)."""
BUDGET_S = 6.0
"""gcp.timeout for these calls: long enough that the line (due at 2 s) is shown while the call still waits."""


class StampedStderr(io.TextIOBase):
    """stderr as the waiting board sees it off a terminal, each line kept with when it was written."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._partial = ""

    def write(self, text: str) -> int:
        now = time.monotonic()
        with self._lock:
            self._partial += text
            *done, self._partial = self._partial.split("\n")
            self.lines.extend((now, line) for line in done)
        return len(text)

    def isatty(self) -> bool:
        return False

    def waiting_lines(self) -> list[tuple[float, str]]:
        with self._lock:
            return [(at, line) for at, line in self.lines if line.startswith("waiting for ")]


@pytest.fixture
def budget() -> Iterator[None]:
    assert waiting_module.SILENT_S == 2.0  # the default the issue asks for, not a test's shortened one
    CLOCK.arm(BUDGET_S)  # the controller's budget: as the CLI arms it when it loads a cluster file
    try:
        yield
    finally:
        CLOCK.disarm()


@contextmanager
def stamped_stderr() -> Iterator[StampedStderr]:
    """Inside the test's body: pytest puts its own capture back on sys.stderr between a fixture and the
    call. The waiting board looks stderr up at each write."""
    stream, saved = StampedStderr(), sys.stderr
    sys.stderr = stream
    try:
        yield stream
    finally:
        sys.stderr = saved


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_tpu_api_call_to_a_silent_port_says_what_it_waits_for_after_2s(budget: None) -> None:
    from tpuft.providers.gcp.api import TpuApi

    with socket.socket() as silent, stamped_stderr() as stderr:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections complete in the backlog; nothing reads or answers
        port = silent.getsockname()[1]
        api = TpuApi("tpuft-test", "us-central2-b", "t5-v4", 1, f"http://127.0.0.1:{port}", timeout=BUDGET_S)
        client = api.client()
        started = time.monotonic()
        with pytest.raises(CloudUnreachable, match=r"reading TPU node nodes/t5-v4: no answer from"):
            api.call("reading TPU node", client.get_node, name=api.node_path("t5-v4"))
    lines = stderr.waiting_lines()
    assert lines, stderr.lines
    first_at, first = lines[0]
    assert first.startswith(
        f"waiting for the Cloud TPU API at http://127.0.0.1:{port} to answer reading TPU node nodes/t5-v4"
    ), first
    assert first_at - started >= EARLIEST_S, f"shown {first_at - started:.2f}s after the call began: {first}"


def test_a_storage_call_to_a_closed_port_names_its_own_service_and_time(
    budget: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Cloud TPU API call fails first (its port closed too) and leaves its outage behind; the storage call
    of the next command (the budget armed again) names Cloud Storage at its own port, after its own 2 s,
    and ends naming its own endpoint and time, not the TPU API's."""
    from tpuft.providers.gcp import tuning
    from tpuft.providers.gcp.api import TpuApi
    from tpuft.storage.gcs import GcsStorage

    monkeypatch.setattr(tuning, "RETRY_BASE_S", 0.05)
    tpu_port, storage_port = closed_port(), closed_port()
    api = TpuApi("tpuft-test", "us-central2-b", "t5-v4", 1, f"http://127.0.0.1:{tpu_port}", timeout=1.0)
    with pytest.raises(CloudUnreachable):
        api.call("reading TPU node", api.client().get_node, name=api.node_path("t5-v4"))

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{storage_port}")
    CLOCK.arm(BUDGET_S)  # the next command
    storage = GcsStorage("tpuft-test-runs", project="tpuft-test")
    started = time.monotonic()
    with stamped_stderr() as stderr, pytest.raises(CloudUnreachable) as failure:
        storage.run_ids()
    lines = stderr.waiting_lines()
    assert lines, stderr.lines
    first_at, first = lines[0]
    assert first.startswith(
        f"waiting for Cloud Storage at http://127.0.0.1:{storage_port} to answer list runs "
        "gs://tpuft-test-runs/runs/: connection refused"
    ), first
    assert first_at - started >= EARLIEST_S, f"shown {first_at - started:.2f}s after the call began: {first}"
    assert all("Cloud TPU API" not in line for _, line in lines), lines
    message = failure.value.message
    assert f"no answer from Cloud Storage at http://127.0.0.1:{storage_port}" in message, message
    assert "Cloud TPU API" not in message and str(tpu_port) not in message, message
    waited = re.search(r" for (\d+)s \(", message)
    assert waited is None or int(waited[1]) < BUDGET_S + 5, message  # this call's time, not an old outage's


def test_monitor_s_node_state_shows_unknown_and_draws_no_wait_from_the_thread_it_leaves(
    budget: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``monitor`` asks the node's state in a thread and stops waiting for it after a few seconds (the live
    view goes on with "unknown"); that thread's call goes on retrying, and its wait line was drawn over the
    live view, and stayed on the waiting board after the refresh (a later wait's terminal line showed it)."""
    from tpuft.config import load_cluster
    from tpuft.providers.gcp import tuning
    from tpuft.readers.monitor import node_state

    monkeypatch.setattr(tuning, "RETRY_BASE_S", 0.05)
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(
        "name: tp\nprovider: gcp\naccelerator: v4-8\ngcp:\n  project: tpuft-test\n  zone: us-central2-b\n"
        f"  tpu_api_endpoint: http://127.0.0.1:{closed_port()}\n  timeout: {BUDGET_S:.0f}s\n"
    )
    config = load_cluster(cluster).value
    with stamped_stderr() as stderr:
        state = node_state(config, timeout_s=EARLIEST_S + 1.5)  # past the 2 s a wait is silent
        on_the_board = list(waiting_module._BOARD.waits)
    assert state.startswith("unknown"), state
    assert stderr.waiting_lines() == [] and on_the_board == [], (stderr.lines, on_the_board)
