"""Which zones offer which TPU generation: ``create`` and ``--dry-run`` refuse a cluster file whose
``gcp.zone`` does not offer its accelerator's generation, before a plan is priced or an API is called
(``gcp.skip_zone_check: true`` for a zone newer than this table).

Why a table: a v6e in us-central2-b (a v4-only zone) used to be planned and priced, and only Google's create
call would have refused it. The source is Google's "TPU regions and zones" page,
https://cloud.google.com/tpu/docs/regions-zones, read from stored copies (no live web here): the English
page at its older address /tpu/docs/types-zones-tpu-vm says "Last updated 2025-09-09 UTC" (TABLE_DATE);
the copies at /tpu/docs/regions-zones, /tpu/docs/regions and docs.cloud.google.com/tpu/docs/types-zones (the
newest: AI zones, TPU7x) show no date; the German version (/tpu/docs/types-zones?hl=de) also lists the
single-tenant zones. What was read in full: the North America / US rows of every generation, and Europe's v6e
(europe-west4-a). The other rows (Europe's v5p, v5e, v3 and v2; Asia Pacific's v6e and v2) are the page's as
known from its earlier versions, NOT re-read from a stored copy (they were cut short there):
:data:`EUROPE_ASIA_UNCHECKED` keeps them apart. A zone any version lists is accepted (the union), so a refusal
means no version listed the generation there. Zones change: the page is the truth, and
``gcp.skip_zone_check`` is the way past an out-of-date table.
"""

from __future__ import annotations

TABLE_DATE = "2025-09-09"
SOURCE = "https://cloud.google.com/tpu/docs/regions-zones"

_READ: dict[str, tuple[str, ...]] = {
    "v6e": (
        "us-central1-b",
        "us-east1-d",
        "us-east5-a",
        "us-east5-b",
        "europe-west4-a",
        # single-tenant (the German version of the page)
        "us-east5-c",
        "us-east4-a",
        "us-east4-b",
        "us-west1-c",
        # AI zones (docs.cloud.google.com/tpu/docs/types-zones, the newest stored version)
        "us-central1-ai1",
        "us-south1-ai1b",
    ),
    "v5p": ("us-central1-a", "us-east5-a", "us-east5-b", "us-east5-c", "us-south1-a"),
    "v5litepod": (
        "us-central1-a",
        "us-south1-a",
        "us-west1-c",
        "us-west4-a",
        "us-east5-a",
        "us-east5-b",
        "us-east5-c",
    ),
    "v4": ("us-central2-b",),
    "v3": ("us-central1-a", "us-central1-b"),
    "v2": ("us-central1-a", "us-central1-b", "us-central1-c"),
    # TPU7x (Compute Engine only): no stored copy of Google's page lists its zones in full; these are the
    # zones SkyPilot's catalogue offers tpu7x-standard-4t in (third-party, undated): gcp.skip_zone_check for
    # others
    "tpu7x": ("us-central1-c", "us-central1-ai1a"),
}
"""Read from the stored copies of the page (US; Europe's v6e), and TPU7x's from SkyPilot's catalogue."""

EUROPE_ASIA_UNCHECKED: dict[str, tuple[str, ...]] = {
    "v6e": ("asia-northeast1-b",),
    "v5p": ("europe-west4-b",),
    "v5litepod": ("europe-west4-b",),
    "v3": ("europe-west4-a",),
    "v2": ("europe-west4-a", "asia-east1-c"),
}
"""The page's Europe and Asia Pacific rows as known from its earlier versions, not re-read (see above)."""

ZONES: dict[str, tuple[str, ...]] = {
    name: tuple(sorted({*zones, *EUROPE_ASIA_UNCHECKED.get(name, ())})) for name, zones in _READ.items()
}
"""Generation (the catalogue's name: ``v5litepod`` for v5e) -> the zones that offer it."""


def zones_for(generation: str) -> tuple[str, ...]:
    """The zones the table knows for ``generation``; empty for a generation it does not list."""
    return ZONES.get(generation, ())


def zone_problem(generation: str, zone: str) -> str | None:
    """Why ``zone`` cannot host ``generation`` by the table, naming the zones that can; None when it can (or
    when the table does not list the generation at all: nothing to judge by)."""
    offered = zones_for(generation)
    if not offered or zone in offered:
        return None
    return (
        f"{zone} offers no {generation} TPUs by Google's TPU regions and zones page (as of {TABLE_DATE}, "
        f"{SOURCE}); {generation} is in {', '.join(offered)}. A zone newer than that table: set "
        "gcp.skip_zone_check: true"
    )
