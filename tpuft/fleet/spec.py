"""Worker specs (``--worker 0,2``, ``1-3``, ``1:0``, ``1:2-3``, ``1:*``) and the argv of an ad-hoc command,
shared by the cold ``exec`` path (:mod:`tpuft.ops.cluster`) and the warm one (:mod:`tpuft.ops.agent_client`),
so both refuse and run the same things. Standard library, :mod:`tpuft.core.errors` and
:mod:`tpuft.core.records` only: the warm path must start fast.

A multislice cluster numbers its workers slice by slice (:class:`tpuft.core.records.SliceLayout`), so a user
names a host either by its flat index, as on one slice, or as ``S:I`` (slice S, host I), the way the slices'
own consoles and logs do. ``S:I`` on a one-slice cluster is slice 0 only.
"""

from __future__ import annotations

from collections.abc import Sequence

from tpuft.core.errors import UsageError
from tpuft.core.records import SliceLayout

_FORMS = "indices like 0,2 or 1-3, or slice:host like 1:0, 1:2-3 or 1:* (a whole slice)"


def parse_worker_list(text: str | None, layout: SliceLayout | int) -> list[int] | None:
    """``"0,2"``, ``"1-3"``, ``"1:0"``, ``"1:2-3"``, ``"1:*"`` (and lists of them) -> flat indices, checked
    against the cluster; None means all workers. ``layout``: the cluster's slices, or a worker count for one
    slice."""
    if isinstance(layout, int):
        layout = SliceLayout(1, layout)
    if text is None or text.strip() in {"", "all", "*"}:
        return None
    chosen: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if ":" in part:
            chosen.extend(_slice_part(text, part, layout))
            continue
        lo, hi = _span(text, part)
        bad = next((i for i in (lo, hi) if not 0 <= i < layout.workers), None)
        if bad is not None:
            raise UsageError(f"--worker {text!r}: no worker {bad} ({_ranges(layout)})")
        chosen.extend(range(lo, hi + 1))
    return sorted(set(chosen))


def _slice_part(text: str, part: str, layout: SliceLayout) -> list[int]:
    """``S:I``, ``S:I-J`` or ``S:*`` -> the flat indices of those hosts of slice S."""
    slice_text, host_text = (x.strip() for x in part.split(":", 1))
    try:
        slice_id = int(slice_text)
    except ValueError:
        raise UsageError(f"--worker {text!r}: expected {_FORMS}") from None
    if not 0 <= slice_id < layout.slices:
        one = " (one slice: 0)" if layout.slices == 1 else ""
        raise UsageError(f"--worker {text!r}: no slice {slice_id}{one} ({_ranges(layout)})")
    lo, hi = (0, layout.hosts - 1) if host_text == "*" else _span(text, host_text)
    bad = next((i for i in (lo, hi) if not 0 <= i < layout.hosts), None)
    if bad is not None:
        raise UsageError(f"--worker {text!r}: slice {slice_id} has no host {bad} ({_ranges(layout)})")
    return [layout.index_of(slice_id, host) for host in range(lo, hi + 1)]


def _span(text: str, part: str) -> tuple[int, int]:
    """``"3"`` or ``"1-3"`` -> the inclusive bounds; anything else (``"3-1"``, ``"x"``) is refused."""
    try:
        lo, hi = (int(x) for x in part.split("-", 1)) if "-" in part[1:] else (int(part), int(part))
    except ValueError:
        raise UsageError(f"--worker {text!r}: expected {_FORMS}") from None
    if hi < lo:
        raise UsageError(f"--worker {text!r}: {part!r} is an empty range (write the lower bound first)")
    return lo, hi


def _ranges(layout: SliceLayout) -> str:
    if layout.slices == 1:
        return f"the cluster has workers 0..{layout.workers - 1}"
    hosts = "1 host (0)" if layout.hosts == 1 else f"{layout.hosts} hosts (0..{layout.hosts - 1})"
    return f"the cluster has slices 0..{layout.slices - 1} of {hosts}, workers 0..{layout.workers - 1}"


def parse_one_worker(text: str, layout: SliceLayout) -> int:
    """``--worker`` of the verbs that reach one worker (``ssh``, ``logs``): ``7`` or ``1:3``."""
    chosen = parse_worker_list(text, layout)
    if chosen is None or len(chosen) != 1:
        raise UsageError(
            f"--worker {text!r}: this command takes one worker (an index like 3, or slice:host like 1:0)"
        )
    return chosen[0]


def command_argv(command: Sequence[str]) -> list[str]:
    """One argument is a shell line (``bash -c``); several are an argv, run as given."""
    if not command:
        raise UsageError("no command given: tpuft exec -- COMMAND [ARGS...]")
    return ["bash", "-c", command[0]] if len(command) == 1 else list(command)


def exec_env(index: int, layout: SliceLayout) -> dict[str, str]:
    """What every ``tpuft exec`` command sees about its place in the cluster; on a multislice cluster also its
    slice (``TPUFT_SLICE_ID``, ``TPUFT_NUM_SLICES``: the names a run's trainers get), so a script can act per
    slice."""
    env = {"TPUFT_WORKER_ID": str(index), "TPUFT_NUM_WORKERS": str(layout.workers)}
    if layout.slices > 1:
        env |= {"TPUFT_SLICE_ID": str(layout.slice_of(index)), "TPUFT_NUM_SLICES": str(layout.slices)}
    return env
