"""``train.compile_cache``: the launch plan names a cache folder for the engines that keep compiled programs
across processes (t5x, torch_xla) unless the recipe says false; keras refuses the key with its reason; and in
each engine's venv a second process finds the first one's program on disk and compiles nothing new.

The venv tests run two real processes of the engine on this CPU. JAX keeps only programs that took over a
second to compile (tpuft's threshold); the test lowers that to 0 in its script so that a tiny function is
kept, which is the one thing it changes."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from tpuft.backends.spec import COMPILE_CACHE_ENV, ClusterShape
from tpuft.config import load_recipe
from tpuft.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "tpuft" / "recipes"


def plan_env(name: str, *settings: str, target: str = "cpu") -> dict[str, str]:
    from tpuft.backends.base import get_backend

    recipe = load_recipe(Path(name), list(settings)).value
    shape = ClusterShape(hosts=2, chips_per_host=4, target=target)  # type: ignore[arg-type]
    return get_backend(recipe.backend.kind).plan(recipe, shape).env


@pytest.mark.parametrize("name", ["t5x_quickstart", "quickstart"])
def test_the_plan_names_a_cache_per_engine_unless_the_recipe_says_false(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TPUFT_COMPILE_CACHE_ROOT", str(tmp_path / "xla"))
    kind = "t5x" if name.startswith("t5x") else "torch_xla"
    assert plan_env(name)[COMPILE_CACHE_ENV] == str(tmp_path / "xla" / kind)  # the local pod: machine-wide
    assert plan_env(name, target="tpu")[COMPILE_CACHE_ENV] == f"~/.cache/tpuft/xla/{kind}"  # the host's home
    assert COMPILE_CACHE_ENV not in plan_env(name, "train.compile_cache=false")


def test_keras_refuses_the_key_with_the_reason() -> None:
    with pytest.raises(ConfigError) as refused:
        load_recipe(Path("keras_quickstart"), ["train.compile_cache=true"])
    assert "train.compile_cache" in str(refused.value) and "TPUStrategy" in str(refused.value)
    assert COMPILE_CACHE_ENV not in plan_env("keras_quickstart")


def run_twice(python: str, code: str, folder: Path, extra_env: dict[str, str]) -> list[dict[str, object]]:
    env = {
        "PYTHONPATH": str(REPO),
        "PATH": "/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/tmp"),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        COMPILE_CACHE_ENV: str(folder),
        **extra_env,
    }
    answers = []
    for _ in range(2):
        proc = subprocess.run(
            [python, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600, env=env
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        answers.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return answers


@pytest.mark.slow
def test_jax_keeps_the_program_and_a_second_process_loads_it(t5x_python: str, tmp_path: Path) -> None:
    code = """
        import json
        import jax, jax.numpy as jnp
        from tpuft.worker.compile_cache import programs, start_jax_cache
        folder = start_jax_cache()
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # the test's one change
        before = programs(folder)
        value = float(jax.jit(lambda x: jnp.sin(x) @ x)(jnp.ones((8, 8))).sum())
        after = programs(folder)
        print(json.dumps({"folder": str(folder), "before": before, "after": after, "value": value}))
    """
    first, second = run_twice(t5x_python, code, tmp_path / "cache", {"JAX_PLATFORMS": "cpu"})
    assert first["folder"] == str(tmp_path / "cache")
    assert first["before"] == 0 and first["after"] >= 1  # the first process compiled and kept it
    assert second["before"] == second["after"] == first["after"]  # the second compiled nothing new
    assert second["value"] == first["value"]


@pytest.mark.slow
def test_torch_xla_keeps_each_process_s_programs_in_its_own_folder(torch_python: str, tmp_path: Path) -> None:
    code = """
        import json
        from tpuft.worker.compile_cache import programs, start_torch_xla_cache
        folder = start_torch_xla_cache(worker=1)
        import torch, torch_xla
        before = programs(folder)
        x = torch.ones(8, 8, device=torch_xla.device())
        value = float((torch.sin(x) @ x).sum().cpu())
        after = programs(folder)
        again = str(start_torch_xla_cache(worker=1))  # a second trainer in this process: the first's
        answer = {"folder": str(folder), "before": before, "after": after, "value": value, "again": again}
        print(json.dumps(answer))
    """
    first, second = run_twice(torch_python, code, tmp_path / "cache", {"PJRT_DEVICE": "CPU"})
    assert first["folder"] == first["again"] == str(tmp_path / "cache" / "worker-1")
    assert first["before"] == 0 and first["after"] >= 1
    assert second["before"] == second["after"] == first["after"]
    assert second["value"] == first["value"]
