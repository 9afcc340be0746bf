"""Pacing SSH handshakes to a pod of hundreds of hosts, so that neither sshd nor this process turns them away.

sshd drops new connections beyond ``MaxStartups`` (default ``10:30:100``: past 10 connections that have not
yet authenticated it drops 30% of new ones, past 100 all of them) by closing the socket before its banner. On
a TPU pod each host runs its own sshd and gets one connection from a fleet, so that limit bites only when many
workers are reached through one server: the same address (NAT'd external IPs with ports of their own, a
ProxyCommand host) or several fleets at once (a cold ``exec`` beside the agent's warm-up). Three rules keep a
1,024-host fan-out clean:

- at most ``max_parallel_connects`` handshakes at once in all (the fleet's thread pool), and at most
  :data:`PER_SERVER_STARTUPS` at once to one server (``host:port`` as reached), under sshd's default start;
- a handshake that a server drops before its banner (what MaxStartups does) is retried after a short jittered
  backoff (:func:`retry_delay`), not the 5 s meant for a VM whose sshd is not up yet: the refused ones come
  back spread out, not in one wave;
- the process may hold a descriptor per connection (:func:`ensure_descriptors`): a shell's usual soft limit of
  1,024 open files would fail the 1,000th handshake, so the soft limit is raised to the hard limit when a
  fleet needs it (as ``ulimit -n`` would; the hard limit is the administrator's, never raised).

paramiko logs each dropped handshake as an error with its traceback; with no logging set up (the CLI sets
none), Python prints that on stderr. The fleet says itself whom it retries and why (its waiting line), so
:func:`quiet_handshake_tracebacks` gives paramiko's loggers a handler that drops them; a program that sets up
logging still gets them through its own handlers.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Iterator

PER_SERVER_STARTUPS = 8
"""Handshakes in flight to one server: below sshd's default ``MaxStartups`` start (10), leaving room for
others."""
DESCRIPTORS_PER_WORKER = 2
"""A connection's socket, and a spare for a ProxyCommand's pipe or a log file."""
DESCRIPTORS_SPARE = 256
REFUSED_DELAY_S = 0.2
REFUSED_DELAY_MAX_S = 3.0


class HandshakeGate:
    """At most :data:`PER_SERVER_STARTUPS` handshakes under way to one ``host:port`` at a time."""

    def __init__(self, per_server: int = PER_SERVER_STARTUPS) -> None:
        self.per_server = per_server
        self._lock = threading.Lock()
        self._servers: dict[str, threading.BoundedSemaphore] = {}

    @contextlib.contextmanager
    def handshake(self, server: str) -> Iterator[None]:
        with self._lock:
            gate = self._servers.setdefault(server, threading.BoundedSemaphore(self.per_server))
        with gate:
            yield


def refused_before_banner(error: BaseException) -> bool:
    """Whether a failed handshake looks like sshd turning it away (MaxStartups, or a listener's full backlog):
    the connection was made, then closed or reset before the server said who it is."""
    if isinstance(error, (ConnectionResetError, EOFError)):
        return True
    text = str(error)
    return "Error reading SSH protocol banner" in text or "Connection reset by peer" in text


def retry_delay(error: BaseException, attempt: int, configured_s: float) -> float:
    """Seconds before the next try: a refused handshake backs off from :data:`REFUSED_DELAY_S`, doubling, with
    jitter (up to :data:`REFUSED_DELAY_MAX_S`, never more than ``configured_s``); anything else waits the
    configured delay (a VM whose sshd is not up yet)."""
    if not refused_before_banner(error):
        return configured_s
    bound = min(configured_s, REFUSED_DELAY_MAX_S, REFUSED_DELAY_S * 2 ** (attempt - 1))
    return random.uniform(bound / 2, bound)


def quiet_handshake_tracebacks() -> None:
    """No paramiko traceback on stderr for a handshake the fleet retries (see the module's docstring)."""
    import logging

    paramiko_log = logging.getLogger("paramiko")
    if not any(isinstance(handler, logging.NullHandler) for handler in paramiko_log.handlers):
        paramiko_log.addHandler(logging.NullHandler())


def ensure_descriptors(workers: int) -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to the hard limit when ``workers`` connections would not fit
    under it. Returns (soft, hard) as they are afterwards (soft may still be short: then the hard limit is
    too)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = workers * DESCRIPTORS_PER_WORKER + DESCRIPTORS_SPARE
    if soft != resource.RLIM_INFINITY and soft < needed and soft != hard:
        wanted = needed if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    return soft, hard
