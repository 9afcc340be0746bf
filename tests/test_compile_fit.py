"""``recipes show --summary --compile`` and ``train --check-fit`` (issue 26, item 1): a T5X recipe's real
train step compiled for its TPU slice on this CPU, and the report made of it.

The report's maths (verdict, suggestions, lower bounds) is tested on made-up compile numbers, without the
venv. The compile itself needs the T5X venv and libtpu (installed once into the venv cache): the quickstart
fits its slice with plausible bytes; a model of ~2B parameters (2+2 wide layers: it compiles as fast as the
quickstart) does not fit a v2-8's 8 GiB TensorCores, and ``train --check-fit`` stops it with exit code 2
before any TPU API call.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.rigs.fake_tpu import FakeTpuServer
from tests.venvs import t5x_source_settings
from tpuft.backends.registry import compile_planner, no_compile_reason
from tpuft.config import load_recipe
from tpuft.core.accelerators import lookup
from tpuft.ops.compile_fit import GIB, CompiledStep, estimate_report, report

RECIPES = Path(__file__).resolve().parents[1] / "tpuft" / "recipes"
SOURCE = t5x_source_settings()


def recipe(overrides: list[str] | None = None, name: str = "t5x_quickstart"):  # type: ignore[no-untyped-def]
    return load_recipe(RECIPES / f"{name}.yaml", overrides or [], check_files=False).value


def step(
    *, args_gib: float, temp_gib: float, devices: int, model: int = 1, flops: float = 0.0
) -> CompiledStep:
    args = int(args_gib * GIB)
    return CompiledStep(
        argument_bytes=args,
        output_bytes=args,
        alias_bytes=args - 2**20,
        temp_bytes=int(temp_gib * GIB),
        generated_code_bytes=2**20,
        flops_per_device=flops,
        devices=devices,
        mesh={"data": devices // model, "model": model},
        compile_s=1.0,
    )


# -- the report's maths, no venv ---------------------------------------------------------------------------
def test_a_step_that_fits_says_what_is_left_and_its_lower_bounds() -> None:
    found = report(recipe(), lookup("v4-8"), step(args_gib=2.0, temp_gib=6.0, devices=4, flops=275e12 * 0.5))
    assert found.fits and found.suggestions == []
    # arguments + new outputs + temps + code
    assert found.total_bytes == int(2 * GIB) + 2**20 + int(6 * GIB) + 2**20
    assert found.verdict().startswith("fits with 24.0 GiB to spare per chip")
    assert found.step_time_s == pytest.approx(0.5)  # per-device flops at v4's 275 TFLOP/s
    assert found.cost_usd == pytest.approx(800 * 0.5 * lookup("v4-8").price_per_hour / 3600, rel=1e-3)
    data = found.to_json()
    assert (
        data["fits"] is True
        and data["source"] == "compile"
        and data["compiled"]["total_bytes"] == found.total_bytes
    )


def test_a_multislice_step_counts_every_slice_but_keeps_model_parallelism_in_one() -> None:
    """2 x v4-8: 8 chips and twice the price per hour; the bytes per chip are one chip's. The state split 2
    ways fits (num_partitions 2 divides one slice's 4 chips; the batch of 32 splits over 2 slices x 2
    replicas)."""
    one = report(recipe(), lookup("v4-8"), step(args_gib=2.0, temp_gib=6.0, devices=8, flops=275e12 * 0.5))
    two = report(recipe(), lookup("v4-8"), step(args_gib=2.0, temp_gib=6.0, devices=8, flops=275e12 * 0.5), 2)
    assert (two.devices, two.accelerator) == (8, "2 x v4-8") and two.total_bytes == one.total_bytes
    assert two.cost_usd == pytest.approx(2 * (one.cost_usd or 0.0), rel=1e-3)
    big = report(recipe(), lookup("v4-8"), step(args_gib=40.0, temp_gib=4.0, devices=8), 2)
    assert big.suggestions[0].startswith("backend.num_partitions: 2 ")
    assert "32.0 GiB per chip on 2 x v4-8" in big.verdict()


def test_a_step_that_does_not_fit_says_what_to_change() -> None:
    """Train state 40 GiB per chip on a v4-8 (32 GiB): split 4 ways it is 10 GiB (num_partitions 4, which
    divides the 4 chips and the batch); more microbatches cannot help (the state alone is too big); a v5p-8
    (95 GiB) can."""
    found = report(recipe(), lookup("v4-8"), step(args_gib=40.0, temp_gib=4.0, devices=4))
    assert not found.fits
    text = found.verdict()
    assert text.startswith("does not fit: needs 44.0 GiB of 32.0 GiB per chip on v4-8, try ")
    assert found.suggestions[0].startswith("backend.num_partitions: 2 (about 24.0 GiB")
    assert not any("num_microbatches" in s for s in found.suggestions)
    assert found.suggestions[-1] == "a v5p-8 (95 GiB per chip)"


def test_temporaries_too_big_suggest_microbatches() -> None:
    found = report(
        recipe(["train.batch_size=64"]), lookup("v4-8"), step(args_gib=4.0, temp_gib=60.0, devices=4)
    )
    assert "backend.num_microbatches: 4 (about 19.0 GiB per device)" in found.suggestions  # 60/4 + 4


def test_a_core_is_the_device_on_v2_and_v3() -> None:
    found = report(recipe(), lookup("v3-8"), step(args_gib=20.0, temp_gib=0.0, devices=8))
    assert found.hbm_bytes == 16 * GIB and found.device_word == "core" and not found.fits
    assert "per core on v3-8" in found.verdict()


def test_backends_without_a_compile_keep_the_estimate_labelled() -> None:
    assert compile_planner("t5x") is not None
    assert compile_planner("torch_xla") is None and compile_planner("keras") is None
    torch = load_recipe(RECIPES / "quickstart.yaml", check_files=False).value
    found = estimate_report(torch, lookup("v4-8"), 40 * GIB, no_compile_reason("torch_xla"))
    assert found.step is None and not found.fits
    assert "; estimate (no compile for torch_xla: " in found.verdict()
    assert found.to_json()["source"].startswith("estimate (no compile for torch_xla")


def test_the_compile_plan_is_the_local_pods_venv_and_the_slices_topology() -> None:
    from tests.venvs import t5x_spec

    planner = compile_planner("t5x")
    assert planner is not None
    plan = planner.compile_plan(recipe(SOURCE[1:]), lookup("v4-32"), "python3")
    assert plan.env.key == t5x_spec().key  # the venv the local pod and the T5X tests use: built once for both
    assert plan.overlay == ("libtpu==0.0.42.1",)
    assert plan.request["topology"] == {
        "name": "v4:2x2x4",
        "chip_config": "megacore",
        "chips_per_host_bounds": [2, 2, 1],
        "num_slices": 1,
    }


def test_a_compiler_refusal_is_one_line_and_the_output_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libtpu answers "Invalid TPU program" for a step with one buffer past a device's HBM (seen here: the
    quickstart at 3072 source bytes x 512 examples on a v2-8): the user gets XLA's words and what to try, not
    a traceback."""
    from tpuft.backends.base import CompilePlan
    from tpuft.ops import compile_fit

    monkeypatch.setenv("TPUFT_HOME", str(tmp_path))
    plan = CompilePlan(env=None, overlay=(), overlay_key="", module="m", request={}, what="T5X's train step")  # type: ignore[arg-type]
    stderr = (
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
        "jax.errors.JaxRuntimeError: INVALID_ARGUMENT: Invalid TPU program.\n"
    )
    refused = compile_fit._compile_failure(plan, 1, stderr)
    assert (
        refused.message
        == "XLA's TPU compiler refused T5X's train step: INVALID_ARGUMENT: Invalid TPU program."
    )
    assert "data.max_source_length" in (refused.hint or "") and "Traceback" not in str(refused)
    log = Path(str(refused.hint).rsplit(": ", 1)[1])
    assert log.read_text() == stderr and log.is_relative_to(tmp_path)
    other = compile_fit._compile_failure(plan, 1, "Traceback ...\nValueError: no such gin binding: x.y\n")
    assert other.message.endswith("T5X's train step: ValueError: no such gin binding: x.y")


# -- the real compile (T5X venv + libtpu) ------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    ("accelerator", "devices", "mesh"),
    [
        ("v4-16", 8, {"data": 8, "model": 1}),
        # T5X's own mesh table stops at v4 ("No default mesh for this configuration"): tpuft's tile
        # (tpuft/worker/t5x/tpu_mesh.py) gives the newer ones theirs; TPU7x shows both TensorCores of a chip
        ("tpu7x-16", 16, {"data": 4, "model": 4}),
        ("v6e-8", 8, {"data": 4, "model": 2}),
    ],
)
def test_the_quickstart_compiles_for_its_slice_and_fits(  # type: ignore[no-untyped-def]
    cli, t5x_python: str, accelerator: str, devices: int, mesh: dict[str, int]
) -> None:
    partitions = ["--set", f"backend.num_partitions={mesh['model']}"] if mesh["model"] > 1 else []
    done = cli(
        "recipes",
        "show",
        "--summary",
        "t5x_quickstart",
        "--compile",
        "--json",
        "--accelerator",
        accelerator,
        *SOURCE,
        *partitions,
    )
    assert done.code == 0, done.err
    fit = json.loads(done.out)["compile"]
    compiled = fit["compiled"]
    assert fit["fits"] and fit["source"] == "compile" and fit["verdict"].startswith("fits with")
    assert compiled["devices"] == devices and compiled["mesh"] == mesh
    params = compiled["params"]
    assert 800_000 < params < 1_000_000  # the quickstart's byt5, shrunk by its gin_overrides
    if mesh["model"] == 1:  # float32 parameters on every replica, plus Adafactor's slots
        assert compiled["argument_bytes"] > params * 4
        assert compiled["alias_bytes"] > params * 4  # the new train state written over the donated one
    # ~6 x params x tokens, split over the devices
    assert compiled["flops_per_device"] > 6 * params * 32 * 56 / devices * 0.5


WIDE = [
    "network.T5Config.emb_dim: 4096",
    "network.T5Config.mlp_dim: 32768",
    "network.T5Config.num_heads: 32",
    "network.T5Config.head_dim: 128",
]


@pytest.mark.slow
def test_check_fit_stops_a_model_too_big_before_any_api_call(
    cli,
    tmp_path: Path,
    t5x_python: str,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a closed port: any bucket call would fail
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    text = (
        (RECIPES / "t5x_quickstart.yaml")
        .read_text(encoding="utf-8")
        .replace("data/numbers", str(RECIPES / "data/numbers"))
    )
    for line in WIDE:
        key = line.split(":")[0]
        text = (
            "\n".join(
                f"    {line}" if row.strip().startswith(f"{key}:") else row for row in text.splitlines()
            )
            + "\n"
        )
    wide = tmp_path / "wide.yaml"
    wide.write_text(text, encoding="utf-8")
    with FakeTpuServer(operation_polls=1, queued_gets_per_state=0) as server:
        cluster = tmp_path / "tpuft.yaml"
        cluster.write_text(
            "name: tp\nprovider: gcp\naccelerator: v2-8\n"
            f"gcp:\n  project: tpuft-test\n  zone: us-central1-b\n  tpu_api_endpoint: {server.endpoint}\n"
        )
        done = cli(
            "train", str(wide), "-c", str(cluster), "--check-fit", "--set", "eval.batch_size=256", *SOURCE
        )
        assert server.requests == []
    assert done.code == 2, done.out + done.err
    assert "does not fit: needs " in done.err and "of 8.0 GiB per core on v2-8" in done.err
    assert "backend.num_partitions: " in done.err  # what to change
