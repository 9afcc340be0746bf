"""``tpuft.core.waiting``: a wait is silent at first, then says on stderr what it waits for and the time it
has left: one line rewritten in place on a terminal (a real pseudo-terminal here), plain lines at a bounded
rate anywhere else, or the caller's progress callback instead of stderr, never both."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import sys
import time

import pytest

from tpuft.core import waiting as waiting_module
from tpuft.core.waiting import duration, waiting


@pytest.fixture(autouse=True)
def own_board(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own waiting board: what these tests read is exactly their waits' drawing, not also a
    wait an earlier test's abandoned thread still has on the process's board."""
    monkeypatch.setattr(waiting_module, "_BOARD", waiting_module._Board())


class Capture(io.StringIO):
    """A stderr that is not a terminal (a pipe, a log file); writes come from the board's thread."""

    def isatty(self) -> bool:
        return False


def test_off_a_terminal_a_wait_is_a_few_plain_lines_after_a_silent_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    err = Capture()
    monkeypatch.setattr(sys, "stderr", err)
    with waiting("a quick thing", timeout=5, silent_s=0.5):
        time.sleep(0.1)
    assert err.getvalue() == ""  # ended before it was worth a line

    with waiting(
        "host keys of TPU node t5 workers 0-1 (the guest agent publishes them)",
        timeout=60,
        silent_s=0.2,
        every_s=0.9,
    ) as wait:
        wait.update("0 of 2 published")
        time.sleep(0.1)
        assert err.getvalue() == ""
        time.sleep(0.5)
        first = err.getvalue()
        wait.update("1 of 2 published")  # news: a line sooner than every_s, but not at once
        time.sleep(1.4)
    lines = err.getvalue().splitlines()
    assert re.fullmatch(
        r"waiting for host keys of TPU node t5 workers 0-1 \(the guest agent publishes them\): "
        r"0 of 2 published \(\d\d s left\)",
        first.strip(),
    ), first
    assert 3 <= len(lines) <= 5, lines  # the first, one or two more while waiting, the end
    assert "1 of 2 published" in lines[-2]
    assert re.fullmatch(r"done: host keys of .* \(after 2 s\)", lines[-1]), lines[-1]


def test_a_wait_without_a_bound_says_how_long_it_has_waited(monkeypatch: pytest.MonkeyPatch) -> None:
    err = Capture()
    monkeypatch.setattr(sys, "stderr", err)
    with pytest.raises(KeyboardInterrupt), waiting("the lock held by pid 42", silent_s=0.1):
        time.sleep(0.4)
        raise KeyboardInterrupt
    assert err.getvalue() == "waiting for the lock held by pid 42 (0 s so far)\n"  # no "done" after an error


def test_on_a_terminal_the_wait_is_one_line_rewritten_and_erased(monkeypatch: pytest.MonkeyPatch) -> None:
    master, slave = pty.openpty()
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setenv("COLUMNS", "200")
    terminal = os.fdopen(slave, "w")
    monkeypatch.setattr(sys, "stderr", terminal)
    try:
        with waiting("the Cloud TPU API to finish creating TPU node t5", timeout=3600, silent_s=0.2) as wait:
            wait.update("state CREATING")
            time.sleep(1.5)
            wait.update("state READY")
            time.sleep(1.2)
        # a pseudo-terminal hands over what was written in pieces: read until it has been quiet a while
        chunks = []
        while select.select([master], [], [], 0.5)[0]:
            chunks.append(os.read(master, 65536))
        written = b"".join(chunks).decode()
    finally:
        terminal.close()
        os.close(master)
    assert "\n" not in written and "\r" in written
    frames = written.split("\r\x1b[K")
    assert frames[0] == "" and frames[-1] == ""  # each frame rewrites the line; the last write erases it
    shown = [frame for frame in frames if frame]
    assert 2 <= len(shown) <= 4, shown  # about one a second, not one per poll
    assert (
        shown[0]
        == "waiting for the Cloud TPU API to finish creating TPU node t5: state CREATING (60 min left)"
    )
    assert shown[-1].endswith(": state READY (60 min left)")


def test_inside_a_spinner_on_a_terminal_the_wait_is_plain_lines_above_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CLI's spinner (rich's ``Live``) puts a proxy on stderr that prints whole lines above it; a wait in
    a slow cloud call under ``create``'s spinner printed a new line of escape-code garbage every second."""
    from rich.console import Console

    master, slave = pty.openpty()
    monkeypatch.setenv("TERM", "xterm")
    terminal = os.fdopen(slave, "w")
    monkeypatch.setattr(sys, "stderr", terminal)
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=200)
    try:
        with console.status("creating t5 (gcp, v4-8)..."):
            assert sys.stderr is not terminal  # the spinner's proxy
            with waiting(
                "Cloud Storage at https://storage.googleapis.com to answer get bucket gs://b",
                30,
                silent_s=0.2,
            ):
                time.sleep(1.6)
    finally:
        terminal.close()
        os.close(master)
    lines = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", line) for line in screen.getvalue().split("\n")]
    waits = [line.split("\r")[-1] for line in lines if "waiting for" in line]
    assert len(waits) == 1, waits  # one line, not one per redraw
    assert waits[0].startswith("waiting for Cloud Storage at https://storage.googleapis.com to answer get"), (
        waits
    )
    assert "\x1b[K" not in screen.getvalue() and "[K" not in "".join(lines)


def test_on_a_narrow_terminal_the_time_left_is_kept_and_the_subject_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tpuft.core.waiting import Wait

    wait = Wait("the SSH host keys of TPU node t5 worker(s) 0-3 (each VM's guest agent publishes them)", 300)
    wait.update("1 of 4 published")
    text = wait.text(60)
    assert (
        len(text) <= 60
        and text.startswith("waiting for the SSH")
        and text.endswith(": 1 of 4 published (5 min left)")
    )


def test_a_progress_callback_hears_the_wait_instead_of_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    err = Capture()
    monkeypatch.setattr(sys, "stderr", err)
    told: list[str] = []
    with waiting(
        "Cloud TPU capacity for queued resource t5", timeout=86400, progress=told.append, silent_s=0
    ) as wait:
        for state in ("ACCEPTED", "WAITING_FOR_RESOURCES", "WAITING_FOR_RESOURCES", "WAITING_FOR_RESOURCES"):
            wait.update(state)
            time.sleep(0.1)
    assert told == [
        "waiting for Cloud TPU capacity for queued resource t5: ACCEPTED (24 h 0 min left)",
        "waiting for Cloud TPU capacity for queued resource t5: WAITING_FOR_RESOURCES (24 h 0 min left)",
    ]
    assert err.getvalue() == ""


def test_durations_read_as_a_person_would_say_them() -> None:
    assert [duration(s) for s in (0, 4.4, 29, 44, 118, 300, 3599, 7300)] == [
        "0 s",
        "4 s",
        "29 s",
        "40 s",
        "120 s",
        "5 min",
        "60 min",
        "2 h 2 min",
    ]
