"""T5X's offline compile (``recipes show --compile``, ``train/up --check-fit``): the plan that has
``tpuft/worker/t5x/compile.py`` compile the run's real train step for a TPU slice on this machine's CPU.

The venv is the T5X backend's CPU venv, the one the local pod trains with (same key: built once for both).
libtpu, the TPU compiler, comes as an overlay folder on ``PYTHONPATH`` rather than in the venv (``jax[tpu]``
would change the venv's key and rebuild it): the version ``jax[tpu]==JAX_VERSION`` pins, built only when a
compile is asked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpuft.backends.base import CompilePlan
from tpuft.backends.t5x import BACKEND, JAX_VERSION
from tpuft.config.loader import dump_recipe

if TYPE_CHECKING:
    from tpuft.config.recipe import RecipeConfig
    from tpuft.core.accelerators import AcceleratorType

LIBTPU_FOR_JAX = {"0.10.2": "0.0.42.1"}
"""``jax[tpu]==X`` -> the libtpu it pins (``pip install --dry-run --report`` of ``jax[tpu]``): the TPU
compiler of the same XLA as the venv's jaxlib."""

LIBTPU_VERSION = LIBTPU_FOR_JAX[JAX_VERSION]

SOURCES_HELP = (
    "backend.t5x_source chooses where t5x, airio and jestimator come from: null (the default) installs "
    "them from their git repositories, which needs git and the network; or set it to a t5x checkout, a t5x "
    "wheel or a folder of t5x/airio/jestimator wheels on this machine, e.g. --set "
    "backend.t5x_source=../wheels (docs/backends.md)"
)


def compile_plan(
    recipe: RecipeConfig, accelerator: AcceleratorType, python: str, slices: int = 1
) -> CompilePlan:
    """``slices`` > 1: the step of a Multislice run, compiled for that many slices of ``accelerator``
    (libtpu's topology of several slices, the mesh's ``replica`` axis over them)."""
    backend = recipe.backend
    topology = accelerator.topology()
    model = f"{backend.family} {backend.size}" if backend.family else "the model of backend.gin_files"
    return CompilePlan(
        env=BACKEND.env_spec(backend, "cpu", python),
        overlay=(f"libtpu=={LIBTPU_VERSION}",),
        overlay_key=f"libtpu-{LIBTPU_VERSION}",
        module="tpuft.worker.t5x.compile",
        request={
            "recipe": dump_recipe(recipe),
            "topology": {
                "name": topology.name,
                "chip_config": topology.chip_config,
                "chips_per_host_bounds": list(topology.chips_per_host_bounds),
                "num_slices": slices,
            },
        },
        # libtpu looks for the TPU it would run on (these say there is none to find), and holds
        # /tmp/libtpu_lockfile against a second process, which two compiles at once (or a compile beside a
        # test) are here. A step that does not fit HBM is compiled all the same, for its bytes, rather than
        # refused with the temporaries' only.
        env_vars={
            "JAX_PLATFORMS": "cpu",
            "TPU_ACCELERATOR_TYPE": accelerator.name,
            "TPU_WORKER_HOSTNAMES": "localhost",
            "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
            "LIBTPU_INIT_ARGS": "--xla_tpu_no_crash_on_oom=true",
            "TF_CPP_MIN_LOG_LEVEL": "3",
        },
        what=f"T5X's train step of {model} ({topology.devices} devices, {topology.name}"
        + (f", x {slices} slices)" if slices > 1 else ")"),
        sources_key=("backend", "t5x_source"),
        sources_help=SOURCES_HELP,
    )
