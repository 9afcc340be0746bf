"""Ports on this machine: one that is free now, and whether a given one is. Used for the rendezvous of a local
pod's workers and for TensorBoard; stdlib only."""

from __future__ import annotations

import socket

from tpuft.core.errors import UsageError

COORDINATOR_PORT = 8476
"""Worker 0's rendezvous port on real hosts (a worker's TF peer port is the next one); workers that share this
machine get a free one instead. Here, not in ops/train.py, so ``doctor`` can check it without importing train
(which runs doctor's checks)."""


MEGASCALE_PORT = 8081
"""Multislice: the port of the runtime's cross-slice (DCN) coordinator on slice 0 host 0 (``MEGASCALE_PORT``;
the value Ray's TPU support sets too). Checked by the connectivity preflight like the coordinator's."""


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free on ``host`` now. Whoever binds it a moment later may still lose a race;
    a clash then shows as that program's "address already in use"."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """Whether ``port`` can be bound on ``host``; a host that is not an address of this machine is a usage
    error."""
    try:
        socket.getaddrinfo(host, port)
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageError(f"--host {host!r}: not an address of this machine ({exc})") from None
    with socket.socket(_family(host), socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True
