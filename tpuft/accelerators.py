"""The Cloud TPU catalogue: accelerator type -> chips, worker hosts, default runtime, list price.

Why a table and not an API call: ``create`` has to show a cost estimate and the local provider has to know how
many workers a ``v4-32`` has, both before (or without) talking to Google. The numbers follow the public Cloud TPU
docs: v2/v3/v4/v5p names count TensorCores (2 per chip), v5litepod/v6e names count chips; hosts carry 4 chips,
except the single-host v5e/v6e shapes of up to 8 chips. HBM per chip, from each generation's system architecture
page: v2 16 GiB (8 per TensorCore), v3 32 GiB (16 per TensorCore), v4 32 GiB, v5e 16 GiB, v5p 95 GiB, v6e 32 GiB.
Prices are on-demand US list prices per chip-hour; they change, so they are an estimate, labelled as such wherever
they are shown.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from tpuft.errors import UsageError


@dataclass(frozen=True)
class Generation:
    name: str
    sizes: tuple[int, ...]
    """The numbers allowed after the dash, e.g. 8 in ``v4-8``."""
    size_counts_cores: bool
    """True when the size counts TensorCores (2 per chip), False when it counts chips."""
    chips_per_host: int
    single_host_max_chips: int
    """Slices of up to this many chips fit on one host (8 for v5e/v6e, 4 elsewhere)."""
    default_runtime: str
    price_per_chip_hour: float | None
    """USD, on-demand, us-central region list price; None where no public price is known."""
    topology_dims: int
    """Dimensions of an accelerator config's topology: 3 for the 3D tori of v4/v5p (2x2x4), else 2 (4x4)."""
    hbm_gib_per_chip: int
    """High-bandwidth memory of one chip, GiB (v2/v3: two TensorCores of 8 / 16 GiB each)."""

    @property
    def devices_per_chip(self) -> int:
        """TPU devices a framework such as TensorFlow sees per chip: v2/v3 chips show their 2 TensorCores apart;
        from v4 on a chip is one device (megacore, or a single core on v5e/v6e)."""
        return 2 if self.name in ("v2", "v3") else 1

    @property
    def hbm_bytes_per_device(self) -> int:
        """HBM of one device as a framework sees it (a TensorCore on v2/v3, a chip from v4 on)."""
        return self.hbm_gib_per_chip * 2**30 // self.devices_per_chip


_POW2 = tuple(2**i for i in range(3, 13))  # 8 .. 4096

GENERATIONS: dict[str, Generation] = {
    g.name: g
    for g in (
        Generation("v2", (8, 32, 128, 256, 512), True, 4, 4, "tpu-ubuntu2204-base", 1.125, 2, 16),
        Generation("v3", (8, 32, 64, 128, 256, 512, 1024, 2048), True, 4, 4, "tpu-ubuntu2204-base", 2.00, 2, 32),
        Generation("v4", _POW2, True, 4, 4, "tpu-ubuntu2204-base", 3.22, 3, 32),
        Generation("v5p", _POW2 + (6144, 8192, 12288), True, 4, 4, "v2-alpha-tpuv5", 4.20, 3, 95),
        Generation("v5litepod", (1, 4, 8, 16, 32, 64, 128, 256), False, 4, 8, "v2-alpha-tpuv5-lite", 1.20, 2, 16),
        Generation("v6e", (1, 4, 8, 16, 32, 64, 128, 256), False, 4, 8, "v2-alpha-tpuv6e", 2.70, 2, 32),
    )
}


@dataclass(frozen=True)
class AcceleratorType:
    name: str
    generation: Generation
    chips: int
    hosts: int

    @property
    def default_runtime(self) -> str:
        return self.generation.default_runtime

    @property
    def price_per_hour(self) -> float | None:
        """Whole-slice on-demand list price per hour (USD), or None when unknown."""
        price = self.generation.price_per_chip_hour
        return None if price is None else round(price * self.chips, 4)

    @property
    def chips_per_host(self) -> int:
        return self.chips // self.hosts


ALIASES = {"v5e": "v5litepod"}
"""Marketing names that users type, mapped to the API's names."""


def all_types() -> list[str]:
    return [f"{g.name}-{size}" for g in GENERATIONS.values() for size in g.sizes]


def lookup(name: str) -> AcceleratorType:
    """Parse ``v4-32`` style names; a bad one is refused with the valid ones (and the closest) listed."""
    gen_name, _, size_text = name.strip().partition("-")
    gen_name = ALIASES.get(gen_name, gen_name)
    generation = GENERATIONS.get(gen_name)
    if generation is None or not size_text.isdigit() or int(size_text) not in generation.sizes:
        raise UsageError(_unknown_message(name, generation))
    size = int(size_text)
    chips = size // 2 if generation.size_counts_cores else size
    hosts = 1 if chips <= generation.single_host_max_chips else chips // generation.chips_per_host
    return AcceleratorType(name=f"{gen_name}-{size}", generation=generation, chips=chips, hosts=hosts)


def _unknown_message(name: str, generation: Generation | None) -> str:
    close = difflib.get_close_matches(name, all_types(), n=3, cutoff=0.6)
    if generation is not None:
        valid = ", ".join(f"{generation.name}-{s}" for s in generation.sizes)
    else:
        valid = "; ".join(f"{g.name}-{{{','.join(str(s) for s in g.sizes)}}}" for g in GENERATIONS.values())
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    return f"unknown accelerator type {name!r}.{hint} Valid types: {valid}"
