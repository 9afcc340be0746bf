"""``--worker``: every form on a multislice layout and on one slice, every refusal naming the valid ranges,
and the warm exec path's idea of the slices (from the remembered workers) matching the cold path's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuft.core.errors import UsageError
from tpuft.core.records import Cluster, SliceLayout, State, Worker
from tpuft.fleet.spec import parse_one_worker, parse_worker_list
from tpuft.ops.agent_client import Identity

TWO_BY_FOUR = SliceLayout(2, 4)


@pytest.mark.parametrize(
    ("text", "chosen"),
    [
        (None, None),
        ("", None),
        ("all", None),
        ("*", None),
        ("0,2", [0, 2]),
        ("1-3", [1, 2, 3]),
        ("7", [7]),
        (" 5 , 1 ", [1, 5]),
        ("1:0", [4]),
        ("0:3", [3]),
        ("1:2-3", [6, 7]),
        ("1:*", [4, 5, 6, 7]),
        ("0:*", [0, 1, 2, 3]),
        ("0:*,1:1", [0, 1, 2, 3, 5]),
        ("1:0,4,0:0", [0, 4]),  # overlaps are one worker each
    ],
)
def test_every_form_on_two_slices(text: str | None, chosen: list[int] | None) -> None:
    assert parse_worker_list(text, TWO_BY_FOUR) == chosen


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2:0", "no slice 2 (the cluster has slices 0..1 of 4 hosts (0..3), workers 0..7)"),
        ("1:4", "slice 1 has no host 4 (the cluster has slices 0..1 of 4 hosts"),
        ("0:1-9", "slice 0 has no host 9"),
        ("8", "no worker 8 (the cluster has slices 0..1 of 4 hosts (0..3), workers 0..7)"),
        ("3-9", "no worker 9"),
        ("-1", "no worker -1"),
        ("3-1", "'3-1' is an empty range"),
        ("1:3-1", "'3-1' is an empty range"),
        ("x", "expected indices like 0,2 or 1-3, or slice:host like 1:0, 1:2-3 or 1:*"),
        ("a:1", "expected indices"),
        ("1:x", "expected indices"),
        ("1:", "expected indices"),
        ("0,,1", "expected indices"),
    ],
)
def test_every_refusal_names_the_valid_ranges(text: str, message: str) -> None:
    with pytest.raises(UsageError) as refused:
        parse_worker_list(text, TWO_BY_FOUR)
    assert message in refused.value.message and refused.value.message.startswith(f"--worker {text!r}: ")


def test_one_slice_takes_slice_zero_only() -> None:
    assert parse_worker_list("0:1-2", 4) == parse_worker_list("1-2", SliceLayout(1, 4)) == [1, 2]
    assert parse_worker_list("0:*", 4) == [0, 1, 2, 3]
    with pytest.raises(UsageError, match=r"no slice 1 \(one slice: 0\) \(the cluster has workers 0\.\.3\)"):
        parse_worker_list("1:0", 4)
    with pytest.raises(UsageError, match=r"no worker 4 \(the cluster has workers 0\.\.3\)"):
        parse_worker_list("4", 4)


def test_one_worker_verbs_take_one() -> None:
    assert parse_one_worker("1:3", TWO_BY_FOUR) == 7 and parse_one_worker("6", TWO_BY_FOUR) == 6
    for many in ("1:*", "0,1", "all"):
        with pytest.raises(UsageError, match="this command takes one worker"):
            parse_one_worker(many, TWO_BY_FOUR)


def test_the_warm_path_reads_the_slices_the_cold_path_has() -> None:
    workers = [Worker(index=i, address=f"10.0.{i // 4}.{i % 4}", slice=i // 4) for i in range(8)]
    cold = Cluster("c", "gcp", State.READY, "v4-32", workers, "gs://b").layout
    rows = [[w.index, w.address, "", w.slice] for w in workers]  # as the GCP provider's cache remembers them
    assert Identity(Path("/x"), "k", "a", rows).layout == cold == TWO_BY_FOUR
    three = [row[:3] for row in rows]  # a record written before slices were remembered
    assert Identity(Path("/x"), "k", "a", three, [["n-0", "1", 4], ["n-1", "2", 4]]).layout == TWO_BY_FOUR
    assert Identity(Path("/x"), "k", "a", three, [["n", "1", 8]]).layout == SliceLayout(1, 8)
    assert Identity(Path("/x"), "k", "a", three).layout == SliceLayout(1, 8)
    # nodes that do not split the workers evenly: the warm path cannot tell, so it leaves the spec to the cold
    # path
    assert Identity(Path("/x"), "k", "a", three, [["n-0", "1", 5], ["n-1", "2", 3]]).layout is None
