from __future__ import annotations

import pytest

from tpuft.core.accelerators import all_types, lookup
from tpuft.core.errors import UsageError


@pytest.mark.parametrize(
    ("name", "chips", "hosts", "runtime"),
    [
        ("v2-8", 4, 1, "tpu-ubuntu2204-base"),
        ("v3-32", 16, 4, "tpu-ubuntu2204-base"),
        ("v4-8", 4, 1, "tpu-ubuntu2204-base"),
        ("v4-16", 8, 2, "tpu-ubuntu2204-base"),
        ("v4-32", 16, 4, "tpu-ubuntu2204-base"),
        ("v5p-8", 4, 1, "v2-alpha-tpuv5"),
        ("v5litepod-1", 1, 1, "v2-alpha-tpuv5-lite"),
        ("v5litepod-8", 8, 1, "v2-alpha-tpuv5-lite"),
        ("v5litepod-16", 16, 4, "v2-alpha-tpuv5-lite"),
        ("v6e-8", 8, 1, "v2-alpha-tpuv6e"),
        ("v6e-256", 256, 64, "v2-alpha-tpuv6e"),
    ],
)
def test_catalogue(name: str, chips: int, hosts: int, runtime: str) -> None:
    acc = lookup(name)
    assert (acc.chips, acc.hosts, acc.default_runtime) == (chips, hosts, runtime)
    assert acc.chips_per_host * acc.hosts == acc.chips


def test_price_is_per_chip_hour_times_chips() -> None:
    assert lookup("v4-8").price_per_hour == pytest.approx(4 * 3.22)
    assert lookup("v5litepod-16").price_per_hour == pytest.approx(16 * 1.20)


@pytest.mark.parametrize(
    ("bad", "suggestion"), [("v4-30", "v4-32"), ("v5e-3", None), ("v4", None), ("tpu-v4-8", None)]
)
def test_bad_type_lists_valid_ones(bad: str, suggestion: str | None) -> None:
    with pytest.raises(UsageError) as info:
        lookup(bad)
    text = str(info.value)
    assert f"unknown accelerator type {bad!r}" in text
    assert "Valid types" in text and any(one in text for one in ("v4-{8,16,", "v4-8", "v5litepod-1", "v5e-1"))
    if suggestion:
        assert f"Did you mean {suggestion}" in text


@pytest.mark.parametrize(
    ("bad", "meant"),
    [
        ("v5e-9", ["v5e-8", "v5e-16"]),  # the alias as typed, the nearest counts: not v5p-8192 or v6e-8
        ("v4-12", ["v4-8", "v4-16"]),
        ("v4-4", ["v4-8"]),  # chips where v4 counts cores: the smallest v4
        ("v5p-9000", ["v5p-8192", "v5p-12288"]),
        ("v5-8", ["v5p-8", "v5e-8"]),  # no such generation: the nearest names, same count
        ("v6-64", ["v6e-64"]),
        ("V5E-8", ["v5e-8"]),
    ],
)
def test_a_near_miss_suggests_the_same_generation_and_the_nearest_count(bad: str, meant: list[str]) -> None:
    with pytest.raises(UsageError) as info:
        lookup(bad)
    assert f"Did you mean {' or '.join(meant)}?" in str(info.value)


def test_the_valid_types_are_listed_in_the_users_spelling() -> None:
    with pytest.raises(UsageError) as info:
        lookup("v5e-9")
    assert "Valid types: v5e-1, v5e-4, v5e-8," in str(info.value) and "v5e is the TPU API's v5litepod" in str(
        info.value
    )


def test_v5e_is_an_alias_of_v5litepod() -> None:
    assert lookup("v5e-8").name == "v5litepod-8"


def test_every_listed_type_parses() -> None:
    for name in all_types():
        assert lookup(name).name == name


def test_local_workers_follow_the_catalogue(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tpuft.config import load_cluster

    path = tmp_path / "tpuft.yaml"
    path.write_text("provider: local\naccelerator: v4-32\n")
    assert load_cluster(path).value.num_workers == 4
    path.write_text("provider: local\naccelerator: v4-32\nlocal:\n  workers: 2\n")
    assert load_cluster(path).value.num_workers == 2


@pytest.mark.parametrize(
    ("name", "topology", "chip_config", "per_host", "devices"),
    [
        ("v4-8", "v4:2x2x1", "megacore", (2, 2, 1), 4),
        ("v4-16", "v4:2x2x2", "megacore", (2, 2, 1), 8),
        ("v4-32", "v4:2x2x4", "megacore", (2, 2, 1), 16),
        ("v4-64", "v4:2x4x4", "megacore", (2, 2, 1), 32),
        ("v5p-8", "v5p:2x2x1", "megacore", (2, 2, 1), 4),
        ("v5litepod-1", "v5e:1x1", "default", (1, 1, 1), 1),
        ("v5litepod-8", "v5e:2x4", "default", (2, 4, 1), 8),
        ("v5litepod-16", "v5e:4x4", "default", (2, 2, 1), 16),
        ("v6e-4", "v6e:2x2", "default", (2, 2, 1), 4),
        ("v3-8", "v3:2x2", "default", (2, 2, 1), 8),
        ("v2-32", "v2:4x4", "default", (2, 2, 1), 32),
    ],
)
def test_topology_as_libtpu_names_it(
    name: str, topology: str, chip_config: str, per_host: tuple[int, ...], devices: int
) -> None:
    """What ``get_topology_desc`` is given for ``--compile``: the torus, each host's block of chips, and the
    devices a framework sees (v2/v3: two TensorCores per chip; megacore v4/v5p: one device per chip)."""
    found = lookup(name).topology()
    assert (found.name, found.chip_config, found.chips_per_host_bounds, found.devices) == (
        topology,
        chip_config,
        per_host,
        devices,
    )
    dims = [int(d) for d in found.name.split(":")[1].split("x")]
    assert devices == lookup(name).chips * lookup(name).generation.devices_per_chip
    product = 1
    for d in dims:
        product *= d
    assert product == lookup(name).chips


def test_peak_flops_per_device() -> None:
    assert lookup("v4-8").generation.peak_flops_per_device == 275e12
    assert lookup("v3-8").generation.peak_flops_per_device == 123e12 / 2  # per TensorCore
    assert lookup("v6e-8").generation.peak_bf16_flops_per_chip == 918e12


@pytest.mark.parametrize(
    ("name", "machine", "hosts", "topology"),
    [
        ("tpu7x-2", "tpu7x-standard-1t", 1, "1x1x1"),
        ("tpu7x-8", "tpu7x-standard-4t", 1, "2x2x1"),
        ("tpu7x-16", "tpu7x-standard-4t", 2, "2x2x2"),
        ("v7x-128", "tpu7x-standard-4t", 16, "4x4x4"),  # the name a TPU7x VM's metadata says
        ("tpu7x-4096", "tpu7x-standard-4t", 512, "8x16x16"),
        ("v6e-8", "ct6e-standard-8t", 1, "2x4"),
        ("v6e-1", "ct6e-standard-1t", 1, "1x1"),
        ("v5p-8", "ct5p-hightpu-4t", 1, "2x2x1"),
    ],
)
def test_compute_engine_makes_each_slice_from_its_machine_type_and_topology(
    name: str, machine: str, hosts: int, topology: str
) -> None:
    from tpuft.core.compute_tpus import compute_shape

    shape = compute_shape(lookup(name))
    assert (shape.machine_type, shape.hosts, shape.topology) == (machine, hosts, topology)
    assert shape.image.startswith("projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-")


@pytest.mark.parametrize(
    ("name", "said"),
    [("v4-8", "Compute Engine makes no v4 TPUs"), ("v6e-16", "multi-host v6e"), ("v5p-16", "multi-host v5p")],
)
def test_what_compute_engine_does_not_make_is_refused_naming_what_it_does(name: str, said: str) -> None:
    from tpuft.core.compute_tpus import compute_problem

    problem = compute_problem(lookup(name))
    assert problem is not None and said in problem and "set gcp.api: tpu" in problem
    assert "Compute Engine makes: " in problem


def test_a_tpu7x_chip_is_two_devices_of_96_gib() -> None:
    tpu7x = lookup("tpu7x-16")
    assert (tpu7x.chips, tpu7x.hosts, tpu7x.devices) == (8, 2, 16)
    assert tpu7x.generation.hbm_bytes_per_device == 96 * 2**30
    assert tpu7x.topology().name == "tpu7x:2x2x2" and tpu7x.topology().chip_config == "default"


def test_a_hosts_worker_id_is_read_from_its_metadata() -> None:
    from types import SimpleNamespace

    from tpuft.providers.gcp.compute_slices import worker_number

    def instance(**items: str) -> SimpleNamespace:
        entries = [SimpleNamespace(key=k.replace("_", "-"), value=v) for k, v in items.items()]
        return SimpleNamespace(metadata=SimpleNamespace(items=entries))

    assert worker_number(instance(tpu_env="TOPOLOGY: '2x2x2'\nTPU_WORKER_ID: '1'\n")) == 1
    assert worker_number(instance(agent_worker_number="3")) == 3
    assert worker_number(instance(startup_script="echo")) > 10**6  # unknown: after the numbered ones
