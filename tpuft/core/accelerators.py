"""The Cloud TPU catalogue: accelerator type -> chips, worker hosts, default runtime, list price.

Why a table and not an API call: ``create`` has to show a cost estimate and the local provider has to know how
many workers a ``v4-32`` has, both before (or without) talking to Google. The numbers follow the public Cloud
TPU docs: v2/v3/v4/v5p/tpu7x names count TensorCores (2 per chip), v5litepod/v6e names count chips; hosts
carry 4 chips, except the single-host v5e/v6e shapes of up to 8 chips. HBM per chip, from each generation's
system architecture page: v2 16 GiB (8 per TensorCore), v3 32 GiB (16 per TensorCore), v4 32 GiB, v5e 16 GiB,
v5p 95 GiB, v6e 32 GiB, tpu7x 192 GiB (docs.cloud.google.com/tpu/docs/tpu7x: "Each TPU7x chip contains two
TensorCores", "HBM capacity per chip (GiB) ... 192", BF16 peak 2307 TFLOP/s; a framework sees its two
TensorCores as two devices). Prices are on-demand US list prices per chip-hour (spot and reserved ones
beside them); they change, so they are an estimate, labelled as such wherever they are shown. Peak bf16
FLOP/s per chip, from the same pages (v2 45, v3 123, v4 275, v5e 197, v5p 459, v6e 918, tpu7x 2307 TFLOP/s):
what turns a compiled step's flops into a lower bound on its time (``recipes show --compile``).

The topology (:meth:`AcceleratorType.topology`) is how libtpu names a slice's shape (``v4:2x2x4``): what
``jax.experimental.topologies.get_topology_desc`` takes to describe the slice's devices on a machine without
TPUs.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace

from tpuft.core.errors import UsageError


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
    peak_bf16_flops_per_chip: float
    """Peak dense bf16 FLOP/s of one chip (both TensorCores on v2/v3)."""
    topology_prefix: str
    """The generation's name in libtpu's topology names (``v5e`` for the API's ``v5litepod``)."""
    spot_price_per_chip_hour: float | None = None
    """USD, spot (or legacy preemptible) capacity; an estimate (see ``_SPOT_AND_RESERVED``)."""
    reserved_price_per_chip_hour: float | None = None
    """USD, reserved capacity, priced at the 1-year committed-use rate; an estimate (see
    ``_SPOT_AND_RESERVED``)."""
    apis: tuple[str, ...] = ("tpu",)
    """Which APIs create it (``gcp.api``): ``tpu`` (the Cloud TPU API), ``compute`` (Compute Engine); TPU7x
    and later are Compute Engine's only (:mod:`tpuft.core.compute_tpus`)."""
    devices_per_chip_override: int | None = None
    """TPU devices per chip where the rule of :attr:`devices_per_chip` does not hold (TPU7x: 2)."""

    def price(self, pricing: str) -> float | None:
        """USD per chip-hour for ``pricing`` (``on-demand``, ``spot`` or ``reserved``, as the node was
        created); None where no public figure is known."""
        if pricing == "spot":
            return self.spot_price_per_chip_hour
        if pricing == "reserved":
            return self.reserved_price_per_chip_hour
        return self.price_per_chip_hour

    @property
    def devices_per_chip(self) -> int:
        """TPU devices a framework such as TensorFlow sees per chip: v2/v3 chips show their 2 TensorCores
        apart; from v4 on a chip is one device (megacore, or a single core on v5e/v6e)."""
        if self.devices_per_chip_override is not None:
            return self.devices_per_chip_override
        return 2 if self.name in ("v2", "v3") else 1

    @property
    def hbm_bytes_per_device(self) -> int:
        """HBM of one device as a framework sees it (a TensorCore on v2/v3, a chip from v4 on)."""
        return self.hbm_gib_per_chip * 2**30 // self.devices_per_chip

    @property
    def peak_flops_per_device(self) -> float:
        return self.peak_bf16_flops_per_chip / self.devices_per_chip


_POW2 = tuple(2**i for i in range(3, 13))  # 8 .. 4096

GENERATIONS: dict[str, Generation] = {
    g.name: g
    for g in (
        Generation(
            "v2", (8, 32, 128, 256, 512), True, 4, 4, "tpu-ubuntu2204-base", 1.125, 2, 16, 45e12, "v2"
        ),
        Generation(
            "v3",
            (8, 32, 64, 128, 256, 512, 1024, 2048),
            True,
            4,
            4,
            "tpu-ubuntu2204-base",
            2.00,
            2,
            32,
            123e12,
            "v3",
        ),
        Generation("v4", _POW2, True, 4, 4, "tpu-ubuntu2204-base", 3.22, 3, 32, 275e12, "v4"),
        Generation(
            "v5p", _POW2 + (6144, 8192, 12288), True, 4, 4, "v2-alpha-tpuv5", 4.20, 3, 95, 459e12, "v5p"
        ),
        Generation(
            "v5litepod",
            (1, 4, 8, 16, 32, 64, 128, 256),
            False,
            4,
            8,
            "v2-alpha-tpuv5-lite",
            1.20,
            2,
            16,
            197e12,
            "v5e",
        ),
        Generation(
            "v6e", (1, 4, 8, 16, 32, 64, 128, 256), False, 4, 8, "v2-alpha-tpuv6e", 2.70, 2, 32, 918e12, "v6e"
        ),
        Generation(
            "tpu7x",
            (2, 8) + tuple(2**i for i in range(4, 13)),  # 1 chip, 4 chips on one host, then 2x2x2 .. 8x16x16
            True,
            4,
            4,
            "",  # no Cloud TPU API runtime: Compute Engine boots an image (tpuft.core.compute_tpus)
            12.00,
            3,
            192,
            2307e12,
            "tpu7x",
            apis=("compute",),
            devices_per_chip_override=2,
        ),
    )
}

# Spot and reserved list prices per chip-hour, USD, us-central regions, ESTIMATES as of 2026 from the public
# Cloud TPU pricing page (https://cloud.google.com/tpu/pricing): spot (v2/v3: the preemptible rate) and the
# 1-year committed-use rate, which is what reserved capacity is billed at (a TPU reservation needs a
# commitment). They vary by region and change (spot prices move with demand): every figure tpuft shows from
# them is labelled an estimate. TPU7x: no public spot or committed-use figure was found (its on-demand $12 per
# chip-hour above is SkyPilot's catalogue's for tpu7x-standard-4t in us-central1, $48 an hour for 4 chips), so
# those stay unknown and a cost shown for them says so.
_SPOT_AND_RESERVED: dict[str, tuple[float | None, float | None]] = {
    "v2": (0.3375, 0.7313),
    "v3": (0.60, 1.30),
    "v4": (0.9660, 2.0286),
    "v5p": (2.10, 2.94),
    "v5litepod": (0.48, 0.84),
    "v6e": (1.35, 1.89),
    "tpu7x": (None, None),
}
GENERATIONS = {
    name: replace(
        g,
        spot_price_per_chip_hour=_SPOT_AND_RESERVED[name][0],
        reserved_price_per_chip_hour=_SPOT_AND_RESERVED[name][1],
    )
    for name, g in GENERATIONS.items()
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

    @property
    def devices(self) -> int:
        return self.chips * self.generation.devices_per_chip

    def topology(self) -> Topology:
        """The slice's shape as libtpu names it: chips laid out as evenly as the torus allows (``v4-32``: 16
        chips, ``v4:2x2x4``), each host's block of chips (2x2x1; a single-host v5e/v6e slice is one block),
        and the chip configuration (``megacore``: one device per v4/v5p chip, as the TPU runtime runs
        them)."""
        generation = self.generation
        dims = _even_dims(self.chips, generation.topology_dims)
        if self.hosts == 1:
            per_host = (*dims, 1) if len(dims) == 2 else dims
        else:
            per_host = (2, 2, 1)
        # megacore: a v4/v5p chip's two TensorCores run as one device; a TPU7x chip shows both
        chip_config = (
            "megacore" if generation.topology_dims == 3 and generation.devices_per_chip == 1 else "default"
        )
        return Topology(
            f"{generation.topology_prefix}:{'x'.join(str(d) for d in dims)}",
            chip_config,
            tuple(per_host),
            self.devices,
            self.hosts,
        )


@dataclass(frozen=True)
class Topology:
    name: str
    """libtpu's topology name, e.g. ``v4:2x2x4``."""
    chip_config: str
    chips_per_host_bounds: tuple[int, ...]
    devices: int
    hosts: int


def _even_dims(chips: int, count: int) -> tuple[int, ...]:
    """``chips`` as ``count`` torus dimensions, as even as the factors allow (16 -> 2x2x4, 32 -> 2x4x4),
    smallest first; a flat 3-D slice keeps its 1 last, as libtpu writes it (a v4-8 is ``2x2x1``). Each factor,
    largest first, multiplies the smallest dimension so far."""
    factors: list[int] = []
    rest, prime = chips, 2
    while rest > 1:
        while rest % prime == 0:
            factors.append(prime)
            rest //= prime
        prime += 1
    dims = [1] * count
    for factor in sorted(factors, reverse=True):
        dims[dims.index(min(dims))] *= factor
    ordered = sorted(dims)
    if count == 3 and ordered[0] == 1:
        ordered = [*ordered[1:], 1]
    return tuple(ordered)


ALIASES = {"v5e": "v5litepod", "v7x": "tpu7x"}
"""Marketing names that users type, mapped to the API's names (a TPU7x VM's own metadata says ``v7x-16`` where
its ``TPU_ACCELERATOR_TYPE`` says ``tpu7x-16``: both are read)."""


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
    close = suggestions(name)
    if generation is not None:
        typed = name.strip().partition("-")[0]
        valid = ", ".join(f"{typed}-{s}" for s in generation.sizes)
        if typed != generation.name:  # v5e: the user's name for it, and the API's
            valid += f" ({typed} is the TPU API's {generation.name})"
    else:
        valid = "; ".join(f"{g.name}-{{{','.join(str(s) for s in g.sizes)}}}" for g in GENERATIONS.values())
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    return f"unknown accelerator type {name!r}.{hint} Valid types: {valid}"


def suggestions(name: str) -> list[str]:
    """What ``name`` most likely meant, best first, read as ``<generation>-<count>``: the generation it names
    (or the nearest name of one: ``v5-8`` is ``v5p``'s or ``v5e``'s), then that generation's nearest valid
    counts, one on either side (``v5e-9`` -> ``v5e-8``, then ``v5e-16``), spelt as the user spelt the
    generation (``v5e``, not ``v5litepod``). Letters' nearness alone would offer ``v5p-8192`` for ``v5e-9``.
    A name without a count falls back to that nearness."""
    typed, _, size_text = name.strip().lower().partition("-")
    if not size_text.isdigit() or not typed:
        return difflib.get_close_matches(name, all_types(), n=3, cutoff=0.6)
    spellings = {**{g: g for g in GENERATIONS}, **ALIASES}
    if typed in spellings:
        typed_as = [typed]
    else:
        typed_as = difflib.get_close_matches(typed, list(spellings), n=2, cutoff=0.6)
    wanted = int(size_text)
    found: list[str] = []
    seen: set[str] = set()
    for spelling in typed_as:
        generation = spellings[spelling]
        if generation in seen:  # v5lite: v5litepod and v5e are one generation
            continue
        seen.add(generation)
        sizes = GENERATIONS[generation].sizes
        if wanted in sizes:
            near = [wanted]
        else:
            near = [*[s for s in sizes if s < wanted][-1:], *[s for s in sizes if s > wanted][:1]]
            near.sort(key=lambda size: (abs(size - wanted), size))
        found += [f"{spelling}-{size}" for size in near if f"{spelling}-{size}" != name.strip()]
    return found[:3]
