"""A zone that does not offer the accelerator's generation is refused before a plan is priced (issue 39,
item 10): ``create --dry-run`` and ``up --dry-run`` of a v6e-256 in us-central2-b (v4 only) stop with exit
code 2 at ``gcp.zone``'s line, naming the zones that do offer v6e, reported with the file's other problems in
one pass; ``gcp.skip_zone_check: true`` lets a zone newer than the table through. Offline: ``--dry-run``
calls no API."""

from __future__ import annotations

from pathlib import Path

from tpuft.core.accelerators import GENERATIONS
from tpuft.core.tpu_zones import ZONES

V6E_IN_A_V4_ZONE = (
    "name: big\nprovider: gcp\naccelerator: v6e-256\ngcp:\n  project: my-project\n  zone: us-central2-b\n"
)


def test_a_zone_without_the_generation_is_refused_at_its_line(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(V6E_IN_A_V4_ZONE)
    for argv in (
        ("create", "-c", str(cluster), "--dry-run"),
        ("up", "quickstart", "-c", str(cluster), "--dry-run"),
    ):
        result = cli(*argv)
        assert result.code == 2, (argv, result.out, result.err)
        said = " ".join(result.err.split())
        assert f"{cluster}:6: gcp.zone: us-central2-b offers no v6e TPUs" in said, said
        assert "us-east5-b" in said and "europe-west4-a" in said and "gcp.skip_zone_check: true" in said
        assert "https://cloud.google.com/tpu/docs/regions-zones" in said
        assert "$" not in result.out  # no plan, no price


def test_the_zone_is_one_problem_among_the_others(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Gathered with the file's other cross-key problems, not a separate early exit."""
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(V6E_IN_A_V4_ZONE.replace("gcp:\n", "local:\n  workers: 2\ngcp:\n"))
    result = cli("create", "-c", str(cluster), "--dry-run")
    assert result.code == 2
    said = " ".join(result.err.split())
    assert "2 problem(s)" in said and "local.workers: applies to provider local only" in said
    assert "gcp.zone: us-central2-b offers no v6e TPUs" in said


def test_skip_zone_check_and_a_zone_that_offers_it_plan(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster = tmp_path / "tpuft.yaml"
    for text in (
        V6E_IN_A_V4_ZONE + "  skip_zone_check: true\n",
        V6E_IN_A_V4_ZONE.replace("us-central2-b", "us-east5-b"),
    ):
        cluster.write_text(text)
        result = cli("create", "-c", str(cluster), "--dry-run")
        assert result.code == 0, result.err
        assert "v6e-256" in result.out


def test_every_generation_of_the_catalogue_has_zones() -> None:
    """The table and the catalogue name the same generations (a new generation needs its zones)."""
    assert set(ZONES) == set(GENERATIONS)
    assert all(ZONES[name] for name in GENERATIONS)
    assert "us-central2-b" in ZONES["v4"] and "us-central2-b" not in ZONES["v6e"]
