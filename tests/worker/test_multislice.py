"""Multislice's environment: what the controller gives the trainers (``TPUFT_NUM_SLICES``, a free cross-slice
port where workers share a machine) and what each trainer sets for its runtime before any framework import
(the MEGASCALE variables), in process: no pod, no backend."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tpuft.backends.spec import LaunchPlan
from tpuft.core.errors import UsageError
from tpuft.core.ports import COORDINATOR_PORT, MEGASCALE_PORT
from tpuft.core.records import Cluster, Worker
from tpuft.worker.context import WorkerContext
from tpuft.worker.multislice import PORT_ENV, STARTUP_FLAG, TARGET_ENV, apply_megascale_env, bound_tpu_startup


def context(worker: int, workers: int, slices: int, coordinator: str = "10.0.0.2:8476") -> WorkerContext:
    return WorkerContext(
        run_id="r",
        run_dir=Path("/tmp/r"),
        worker_id=worker,
        num_workers=workers,
        coordinator=coordinator,
        num_slices=slices,
    )


def test_each_trainer_gets_its_slice_and_slice_0_host_0_as_the_coordinator() -> None:
    environ: dict[str, str] = {}
    line = apply_megascale_env(context(3, 4, 2), environ)
    assert environ == {
        "MEGASCALE_COORDINATOR_ADDRESS": f"10.0.0.2:{MEGASCALE_PORT}",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": "1",
        "MEGASCALE_PORT": str(MEGASCALE_PORT),
    }
    assert line == f"multislice: slice 1 of 2, host 1 of 2, coordinator 10.0.0.2:{MEGASCALE_PORT}"
    local = {PORT_ENV: "40123"}  # the local pod: the controller's free port, not the fixed one
    apply_megascale_env(context(0, 2, 2, "127.0.0.1:39999"), local)
    assert local["MEGASCALE_COORDINATOR_ADDRESS"] == "127.0.0.1:40123" and local["MEGASCALE_SLICE_ID"] == "0"


def test_one_slice_sets_nothing_and_uneven_slices_are_refused() -> None:
    environ: dict[str, str] = {}
    assert apply_megascale_env(context(1, 2, 1), environ) is None
    assert environ == {}
    with pytest.raises(UsageError, match="does not divide the 3 launched workers"):
        apply_megascale_env(context(0, 3, 2), environ)


def session(address: str, slices: int, hosts: int) -> SimpleNamespace:
    workers = [
        Worker(index=s * hosts + i, address=address if s * hosts + i == 0 else f"10.0.{s}.{i + 2}", slice=s)
        for s in range(slices)
        for i in range(hosts)
    ]
    target = "cpu" if address == "localhost" else "tpu"
    return SimpleNamespace(
        cluster=Cluster("c", "gcp", "ready", "v4-8", workers), shape=SimpleNamespace(target=target)
    )


def test_the_controller_says_how_many_slices_and_picks_a_free_port_on_one_machine() -> None:
    from tpuft.ops.trainer_env import trainer_env

    config = SimpleNamespace(name="c", worker_env={})
    env = trainer_env(session("10.0.0.2", 2, 2), config, LaunchPlan((0, 1, 2, 3)), False, "t5x")  # type: ignore[arg-type]
    assert env["TPUFT_NUM_SLICES"] == "2" and env[PORT_ENV] == str(MEGASCALE_PORT)
    assert env["TPUFT_COORDINATOR"] == f"10.0.0.2:{COORDINATOR_PORT}" and env[TARGET_ENV] == "tpu"
    local = trainer_env(session("localhost", 2, 1), config, LaunchPlan((0, 1)), False, "t5x")  # type: ignore[arg-type]
    taken = {
        local["TPUFT_COORDINATOR"].rsplit(":", 1)[1],
        *(p.rsplit(":", 1)[1] for p in local["TPUFT_PEERS"].split(",")),
    }
    assert local[PORT_ENV] not in taken | {str(MEGASCALE_PORT)}
    single = trainer_env(session("10.0.0.2", 1, 2), config, LaunchPlan((0, 1)), False, "t5x")  # type: ignore[arg-type]
    assert single["TPUFT_NUM_SLICES"] == "1" and PORT_ENV not in single


def test_a_plan_that_leaves_hosts_out_of_a_multislice_cluster_is_refused() -> None:
    from tpuft.ops.trainer_env import launched_slices

    with pytest.raises(
        UsageError, match=r"the keras backend's launch plan runs on worker\(s\) \[0\] only.*2 slices of 2"
    ):
        launched_slices(session("10.0.0.2", 2, 2), LaunchPlan((0,)), "keras")  # type: ignore[arg-type]
    assert launched_slices(session("10.0.0.2", 1, 2), LaunchPlan((0,)), "keras") == 1  # type: ignore[arg-type]


def test_run_json_records_the_slices_and_each_workers_place_and_old_ones_read_as_one_slice() -> None:
    from tpuft.ops.lifecycle import run_layout
    from tpuft.ops.train import _placement

    placed = _placement(session("10.0.0.2", 2, 2), LaunchPlan((0, 1, 2, 3)))  # type: ignore[arg-type]
    assert placed == {
        "slices": 2,
        "placement": [
            {"slice": 0, "host": 0},
            {"slice": 0, "host": 1},
            {"slice": 1, "host": 0},
            {"slice": 1, "host": 1},
        ],
    }
    assert run_layout({"workers": 4, **placed}).name(2) == "slice 1 host 0 (worker 2)"
    assert run_layout({"workers": 2}).name(1) == "worker 1"  # a run.json from before multislice


def test_libtpu_start_up_bound_comes_from_startup_timeout_on_tpu_hosts_unless_the_user_set_it() -> None:
    environ = {"LIBTPU_INIT_ARGS": "--xla_tpu_enable_data_parallel_all_reduce_opt=true"}
    assert bound_tpu_startup(1800.0, environ) == f"{STARTUP_FLAG}=1800s"
    assert (
        environ["LIBTPU_INIT_ARGS"]
        == f"--xla_tpu_enable_data_parallel_all_reduce_opt=true {STARTUP_FLAG}=1800s"
    )
    mine = {"LIBTPU_INIT_ARGS": f"{STARTUP_FLAG}=2h"}
    assert (
        bound_tpu_startup(60.0, mine) == f"{STARTUP_FLAG}=2h"
        and mine["LIBTPU_INIT_ARGS"] == f"{STARTUP_FLAG}=2h"
    )
    tpu: dict[str, str] = {TARGET_ENV: "tpu"}
    line = apply_megascale_env(context(1, 2, 2), tpu, startup_timeout=600.0)
    assert (
        tpu["LIBTPU_INIT_ARGS"] == f"{STARTUP_FLAG}=600s"
        and line is not None
        and line.endswith(f"libtpu {STARTUP_FLAG}=600s")
    )
    cpu: dict[str, str] = {TARGET_ENV: "cpu"}  # the local pod's runtime has no libtpu to give flags to
    apply_megascale_env(context(1, 2, 2), cpu, startup_timeout=600.0)
    assert "LIBTPU_INIT_ARGS" not in cpu and cpu["MEGASCALE_NUM_SLICES"] == "2"
