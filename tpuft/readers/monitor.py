"""Watching a run from the controller: one refresh of ``tpuft monitor`` is the run's snapshot
(:mod:`tpuft.readers.runs`) plus the provider's word for the node, asked with a deadline so a slow cloud API
never freezes the view. The CLI renders it (:mod:`tpuft.cli.render`)."""

from __future__ import annotations

from typing import Any

from tpuft.config import ClusterConfig
from tpuft.core.records import SliceLayout
from tpuft.readers.runs import Run, RunSnapshot


def run_layout(info: dict[str, Any], workers: int = 0) -> SliceLayout:
    """The slices of a run's launched workers, from its run.json (``slices``; absent in a one-slice run or one
    written before multislice), so its workers are labelled and addressed ``S:I`` as the cluster's are.
    ``workers``: the count seen otherwise (logs, heartbeats) when run.json does not say."""
    try:
        slices = max(1, int(info.get("slices") or 1))
        count = int(info.get("workers") or 0) or workers
    except (TypeError, ValueError):
        return SliceLayout(1, max(workers, 1))
    if slices == 1 or count % slices:
        return SliceLayout(1, max(count, 1))
    return SliceLayout(slices, count // slices)


def node_state(config: ClusterConfig, *, timeout_s: float = 8.0) -> str:
    """The provider's word for the cluster now. A failed or slow API call (the provider retries for up to half
    a minute) is shown, not raised or waited out: the live view keeps refreshing from the run dir."""
    import threading

    from tpuft.core.errors import TpuftError
    from tpuft.providers import get_provider
    from tpuft.storage.network import quiet_calls

    answer: dict[str, str] = {}

    def ask() -> None:
        try:
            with quiet_calls():  # shown as "unknown (...)", never as a wait line over the live view
                answer["state"] = str(get_provider(config).get().state)
        except TpuftError as exc:
            answer["state"] = f"unknown ({exc.message.splitlines()[0][:80]})"

    thread = threading.Thread(target=ask, name="tpuft-node-state", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return answer.get("state", f"unknown (the {config.provider} API did not answer in {timeout_s:.0f} s)")


def watch(config: ClusterConfig, run: Run) -> RunSnapshot:
    """One refresh of ``tpuft monitor``: the run's files (mirrored when in a bucket), its logs' tails, the
    node."""
    return run.snapshot(logs=True, node_state=node_state(config))
