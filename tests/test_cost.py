"""Cost so far: chip-hours of the attempts x the catalogue's price for the pricing the capacity was created
with."""

from __future__ import annotations

import pytest

from tpuft.config.cluster import GcpConfig
from tpuft.core.accelerators import GENERATIONS, lookup
from tpuft.core.errors import UsageError
from tpuft.run import cost


def test_every_generation_has_a_spot_price_below_reserved_below_on_demand() -> None:
    unknown = set()
    for generation in GENERATIONS.values():
        spot, reserved, on_demand = (generation.price(p) for p in ("spot", "reserved", "on-demand"))
        assert on_demand is not None and on_demand > 0, generation.name
        if spot is None or reserved is None:
            unknown.add(generation.name)
            continue
        assert 0 < spot < on_demand and 0 < reserved < on_demand, generation.name
    # TPU7x: no public spot or committed-use figure (tpuft.core.accelerators); shown as unknown, never guessed
    assert unknown == {"tpu7x"}


def test_per_attempt_hours_chips_and_pricing_as_created() -> None:
    info = {
        "accelerator": "v4-32",
        "chips": 16,
        "pricing": "spot",
        "status": "running",
        "provider": "gcp",
        "attempts": [
            {"attempt": 1, "started": 1000.0, "ended": 1000.0 + 1800},
            {"attempt": 2, "started": 10_000.0},
        ],
    }
    found = cost.run_cost(info, now=10_000.0 + 3600)
    spot = lookup("v4-32").generation.price("spot")
    assert [a["attempt"] for a in found.per_attempt] == [1, 2]
    assert [a["hours"] for a in found.per_attempt] == [0.5, 1.0]
    assert found.chip_hours == pytest.approx(16 * 1.5)
    assert found.total_usd == pytest.approx(16 * 1.5 * spot)
    assert {a["pricing"] for a in found.per_attempt} == {"spot"} and found.billed
    assert "estimate" in found.note and found.label().startswith("$") and "est." in found.label()


def test_an_ended_run_stops_counting_and_an_old_run_json_is_priced_on_demand() -> None:
    # no ended on the attempt: the run's end counts
    info = {
        "accelerator": "v5litepod-8",
        "slices": 2,
        "status": "failed",
        "ended": 7200.0,
        "provider": "gcp",
        "attempts": [{"attempt": 1, "started": 0.0}],
    }
    found = cost.run_cost(info, now=99_999.0)
    assert found.per_attempt[0]["chips"] == 16 and found.per_attempt[0]["hours"] == 2.0
    assert found.total_usd == pytest.approx(16 * 2 * 1.20)
    assert "predates its pricing" in found.note


def test_local_pod_is_not_billed_and_an_unknown_price_leaves_chip_hours() -> None:
    local = cost.run_cost(
        {
            "accelerator": "v4-8",
            "chips": 4,
            "pricing": "on-demand",
            "provider": "local",
            "status": "finished",
            "attempts": [{"attempt": 1, "started": 0.0, "ended": 3600.0}],
        }
    )
    assert not local.billed and "not billed" in local.label() and "nothing is billed" in local.note
    unknown = cost.run_cost(
        {
            "accelerator": "v9-8",
            "chips": 4,
            "pricing": "spot",
            "status": "finished",
            "attempts": [{"attempt": 1, "started": 0.0, "ended": 3600.0}],
        }
    )
    assert unknown.total_usd is None and unknown.chip_hours == 4.0 and unknown.label() == "4.00 chip-h"
    assert "no list price known" in unknown.note


def test_launch_fields_from_the_cluster_file() -> None:
    assert cost.launch_fields("v4-8", GcpConfig(spot=True), 1) == {"pricing": "spot", "chips": 4}
    assert cost.launch_fields("v4-8", GcpConfig(preemptible=True), 1)["pricing"] == "spot"
    assert cost.launch_fields("v4-8", GcpConfig(queued=True, reservation="r1"), 2) == {
        "pricing": "reserved",
        "chips": 8,
    }
    assert cost.launch_fields("v6e-8", GcpConfig(), 1) == {"pricing": "on-demand", "chips": 8}


def test_a_resume_is_refused_once_the_limit_is_spent_unless_raised() -> None:
    # $12.88 spent
    info = {
        "accelerator": "v4-8",
        "chips": 4,
        "pricing": "on-demand",
        "provider": "gcp",
        "status": "stopped",
        "max_cost": 10.0,
        "attempts": [{"attempt": 1, "started": 0.0, "ended": 3600.0}],
    }
    with pytest.raises(UsageError) as refused:
        cost.check_budget("r1", info, None)
    assert "has cost $12.88 so far" in refused.value.message and "--max-cost" in (refused.value.hint or "")
    assert cost.check_budget("r1", info, 20.0)["max_cost"] == 20.0
    assert cost.check_budget("r1", {**info, "max_cost": None}, None)["max_cost"] is None  # no limit: no check
    with pytest.raises(UsageError):
        cost.check_budget("r1", info, 0.0)


def test_resume_max_cost_on_the_cli(tmp_path, cli) -> None:  # type: ignore[no-untyped-def]
    import json

    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(
        f"name: budget\nbucket: {tmp_path / 'bucket'}\naccelerator: v4-8\nlocal:\n  workers: 1\n"
    )
    run_dir = tmp_path / "bucket" / "runs" / "demo-20261126-120000-0001"
    run_dir.mkdir(parents=True)
    info = {
        "run_id": run_dir.name,
        "accelerator": "v4-8",
        "chips": 4,
        "pricing": "on-demand",
        "provider": "local",
        "status": "stopped",
        "max_cost": 10.0,
        "attempt": 1,
        "attempts": [{"attempt": 1, "started": 0.0, "ended": 3600.0}],
    }
    (run_dir / "run.json").write_text(json.dumps(info))
    spent = cli("resume", run_dir.name, "-c", str(cluster))
    assert (
        spent.code == 2
        and "its train.max_cost $10.00 is spent" in spent.err
        and "--max-cost USD" in spent.err
    )
    assert cli("resume", run_dir.name, "-c", str(cluster), "--max-cost", "0").code == 2
    raised = cli("resume", run_dir.name, "-c", str(cluster), "--max-cost", "20")
    assert json.loads((run_dir / "run.json").read_text())["max_cost"] == 20.0
    # past the budget check (this stand-in run has no launch)
    assert raised.code == 2 and "is spent" not in raised.err
