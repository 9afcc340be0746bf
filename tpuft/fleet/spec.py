"""Worker specs (``--worker 0,2`` or ``1-3``) and the argv of an ad-hoc command, shared by the cold ``exec`` path
(:mod:`tpuft.ops.cluster`) and the warm one (:mod:`tpuft.ops.agent_client`), so both refuse and run the same
things. Standard library and :mod:`tpuft.errors` only: the warm path must start fast.
"""

from __future__ import annotations

from collections.abc import Sequence

from tpuft.errors import UsageError


def parse_worker_list(text: str | None, count: int) -> list[int] | None:
    """``"0,2"`` or ``"1-3"`` -> indices, checked against the cluster; None means all workers."""
    if text is None or text.strip() in {"", "all"}:
        return None
    chosen: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                chosen.extend(range(lo, hi + 1))
            else:
                chosen.append(int(part))
        except ValueError:
            raise UsageError(f"--worker {text!r}: expected indices like 0,2 or 1-3") from None
    bad = [i for i in chosen if not 0 <= i < count]
    if bad:
        raise UsageError(f"--worker {text!r}: no worker {bad[0]} (the cluster has workers 0..{count - 1})")
    return sorted(set(chosen))


def command_argv(command: Sequence[str]) -> list[str]:
    """One argument is a shell line (``bash -c``); several are an argv, run as given."""
    if not command:
        raise UsageError("no command given: tpuft exec -- COMMAND [ARGS...]")
    return ["bash", "-c", command[0]] if len(command) == 1 else list(command)


def exec_env(index: int, count: int) -> dict[str, str]:
    """What every ``tpuft exec`` command sees about its place in the cluster."""
    return {"TPUFT_WORKER_ID": str(index), "TPUFT_NUM_WORKERS": str(count)}
