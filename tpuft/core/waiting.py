"""Waits that say what they wait for: anything that may block for more than a couple of seconds (host keys a
fresh VM has not published, a long-running cloud operation, a queued resource waiting for capacity, a lock
another process holds, SSH connection retries) runs inside ``waiting(...)``, so a user never stares at a
silent terminal.

A wait is silent for its first ``SILENT_S`` seconds (most waits end sooner, and a line that flashes is noise),
then writes to stderr what it waits for, its latest detail and the time it has left (or has waited, when it
has no bound). On a terminal that is one line, rewritten in place about once a second and erased when the wait
ends; concurrent waits (one SSH connection per worker) share it. Anywhere else (a pipe, a log file, a worker's
output streamed over SSH) it is plain lines: one when the wait is first shown, then one every ``EVERY_S``
seconds (every third of that when the detail changed), and one at the end.

A wait whose caller already reports through a ``Progress`` callback (the CLI's spinner for ``create``, the
recovery watcher's lines) says it there instead, never twice: the callback gets the same text whenever it
changes, with the time left in whole minutes once there are more than two of them, so a line-printing callback
prints about one line a minute, not one per poll.

Stdlib only (a foundation): the providers, the fleet, the ops and the worker side all use it.
``TPUFT_WAIT_SILENT_S`` and ``TPUFT_WAIT_EVERY_S`` change the two thresholds (tests shorten them).
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

SILENT_S = float(os.environ.get("TPUFT_WAIT_SILENT_S", "2"))
"""How long a wait stays quiet before it is shown."""
EVERY_S = float(os.environ.get("TPUFT_WAIT_EVERY_S", "30"))
"""Off a terminal: the longest gap between two lines of one wait whose detail does not change."""
REDRAW_S = 1.0
"""On a terminal: how often the line is rewritten (the time left counts down)."""


def duration(seconds: float) -> str:
    """``42 s``, ``3 min``, ``2 h 5 min``: seconds below two minutes (rounded to 10 s above 30 s, so the text
    does not change every poll), whole minutes above."""
    seconds = max(0.0, seconds)
    if seconds < 30:
        return f"{seconds:.0f} s"
    if seconds < 120:
        return f"{round(seconds / 10) * 10:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 120:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min"


class Wait:
    """One wait: what it is for, its bound, its latest detail. ``update`` is cheap: call it every poll."""

    def __init__(
        self,
        what: str,
        timeout: float | None,
        *,
        detail: str = "",
        progress: Callable[[str], None] | None = None,
        silent_s: float | None = None,
        every_s: float | None = None,
    ) -> None:
        self.what = what
        self.timeout = timeout
        self.detail = detail
        self.progress = progress
        self.silent_s = SILENT_S if silent_s is None else silent_s
        self.every_s = EVERY_S if every_s is None else every_s
        self.started = time.monotonic()
        self.shown = False
        """Whether a line (or a progress message) has been written for this wait."""
        self._last_line = float("-inf")
        self._last_text = ""
        """The last text a progress callback was given."""
        self._last_detail = ""
        """Off a terminal: the detail the last line showed."""

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float | None:
        """Seconds left before the bound (never below 0), or None for a wait without one."""
        return None if self.timeout is None else max(0.0, self.timeout - self.elapsed)

    def expired(self) -> bool:
        left = self.left()
        return left is not None and left <= 0

    def update(self, detail: str) -> None:
        """The wait's news (``2 of 4 published``, the resource's state); a progress callback hears of it at
        once."""
        self.detail = detail
        if self.progress is not None:
            self._tell_progress()

    def text(self, width: int | None = None) -> str:
        """``waiting for WHAT: DETAIL (N s left)``; within ``width`` the thing waited for is cut, never the
        time."""
        left = self.left()
        clock = f"{duration(self.elapsed)} so far" if left is None else f"{duration(left)} left"
        detail = f": {self.detail}" if self.detail else ""
        what = self.what
        text = f"waiting for {what}{detail} ({clock})"
        if width is not None and len(text) > width:
            room = max(10, len(what) - (len(text) - width) - 1)
            text = f"waiting for {what[:room]}…{detail} ({clock})"
            if len(text) > width:
                text = text[: max(10, width - 1)] + "…"
        return text

    def _tell_progress(self) -> None:
        assert self.progress is not None
        text = self.text()
        if text != self._last_text:
            self._last_text = text
            self.shown = True
            self.progress(text)

    def line_due(self, now: float) -> bool:
        """Off a terminal: a line is due when the wait is first shown, ``every_s`` after the last one, or a
        third of that after it when the detail changed (news, but not a line per poll)."""
        if now - self.started < self.silent_s:
            return False
        since = now - self._last_line
        return (
            not self.shown
            or since >= self.every_s
            or (self.detail != self._last_detail and since >= self.every_s / 3)
        )

    def mark_line(self, now: float) -> None:
        self.shown = True
        self._last_line = now
        self._last_detail = self.detail


class _Board:
    """The waits under way in this process and the one thread that shows them on stderr."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waits: list[Wait] = []
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.drawn = False
        """Whether the terminal line currently shows something (to erase)."""

    @staticmethod
    def stream() -> TextIO:
        return sys.stderr  # looked up each time: tests and the CLI may replace it

    @staticmethod
    def on_terminal(stream: TextIO) -> bool:
        """Whether the line may be rewritten in place. Not through a proxy that prints whole lines above a
        spinner (rich's ``Live`` puts one on stderr while the CLI's spinner turns, and its ``isatty`` is the
        terminal's): there an in-place frame came out as a new line of ``[K``-garbage every second, so a
        wait inside a spinner (a slow cloud call during ``create``) gets plain lines instead."""
        if getattr(stream, "rich_proxied_file", None) is not None:
            return False
        try:
            return stream.isatty() and os.environ.get("TERM", "") != "dumb"
        except (AttributeError, ValueError):
            return False

    def add(self, wait: Wait) -> None:
        with self.lock:
            self.waits.append(wait)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="tpuft-waiting", daemon=True)
                self.thread.start()
        self.wake.set()

    def remove(self, wait: Wait, outcome: str | None) -> None:
        with self.lock:
            self.waits.remove(wait)
            stream = self.stream()
            try:
                if self.on_terminal(stream):
                    if self.drawn:
                        self._write(stream, "\r\x1b[K")
                        self.drawn = False
                    self._draw(stream, time.monotonic())
                elif wait.shown and outcome is not None:
                    self._write(stream, f"{outcome}: {wait.what} (after {duration(wait.elapsed)})\n")
            except (OSError, ValueError):
                pass
        self.wake.set()

    def _run(self) -> None:
        while True:
            with self.lock:
                if not self.waits:
                    self.thread = None
                    return
                now = time.monotonic()
                waits = list(self.waits)
            nearest = min(max(0.05, w.started + w.silent_s - now) for w in waits)
            self.wake.wait(min(REDRAW_S, nearest) if not all(w.shown for w in waits) else REDRAW_S)
            self.wake.clear()
            with self.lock:
                stream = self.stream()
                try:
                    if self.on_terminal(stream):
                        self._draw(stream, time.monotonic())
                    else:
                        self._lines(stream, time.monotonic())
                except (OSError, ValueError):  # stderr closed under us (a pipe whose reader left)
                    pass

    def _draw(self, stream: TextIO, now: float) -> None:
        """One line for every wait past its silent time, cut to the terminal's width so that ``\\r`` rewrites
        it."""
        visible = [w for w in self.waits if w.progress is None and now - w.started >= w.silent_s]
        if not visible:
            return
        for wait in visible:
            wait.shown = True
        width = shutil.get_terminal_size((100, 24)).columns - 1
        more = f" (and {len(visible) - 1} more)" if len(visible) > 1 else ""
        text = visible[0].text(max(20, width - len(more))) + more
        self._write(stream, f"\r\x1b[K{text}")
        self.drawn = True

    def _lines(self, stream: TextIO, now: float) -> None:
        for wait in self.waits:
            if wait.progress is None and wait.line_due(now):
                wait.mark_line(now)
                self._write(stream, wait.text() + "\n")

    @staticmethod
    def _write(stream: TextIO, text: str) -> None:
        stream.write(text)
        stream.flush()


_BOARD = _Board()


@contextmanager
def waiting(
    what: str,
    timeout: float | None = None,
    *,
    detail: str = "",
    progress: Callable[[str], None] | None = None,
    silent_s: float | None = None,
    every_s: float | None = None,
) -> Iterator[Wait]:
    """Show this wait on stderr (or through ``progress``) while the block runs; see the module's docstring.

    ``what`` completes "waiting for ...": name the thing and who makes it happen ("host keys of TPU node t5
    workers 0-3 (published by each VM's guest agent at boot)"). ``timeout`` is the caller's own bound, shown
    as time left; the caller still enforces it (``Wait.expired``)."""
    wait = Wait(what, timeout, detail=detail, progress=progress, silent_s=silent_s, every_s=every_s)
    if progress is not None:
        yield wait  # the caller's callback shows it, from the first update on
        return
    _BOARD.add(wait)
    outcome: str | None = None
    try:
        yield wait
        outcome = "done"
    except BaseException:
        outcome = None  # the error that follows says what happened
        raise
    finally:
        _BOARD.remove(wait, outcome)
