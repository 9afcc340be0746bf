"""T5X: gin + seqio, the same multi-controller JAX program on every host of a pod.

The recipe names a model by family and size (one of t5x's own ``examples/`` gins) or by the user's gin files,
the task (fine-tuning on JSON lines, or span-corruption pretraining on plain text), and the few bindings every
user sets; the worker (``tpuft/worker/t5x/train.py``) writes the seqio task module and the run gin from them
into the run dir, so nobody writes Python or pastes gin by hand, and starts ``t5x.train`` in-process.

On TPU hosts JAX's runtime finds the other hosts itself (every host must start: one that does not makes the
others wait). On the local CPU pod the trainer calls ``jax.distributed.initialize`` with worker 0 as the
coordinator, and JAX's gloo CPU collectives make the rehearsal a real 2-host run; each worker exposes
``local.devices_per_worker`` CPU devices, so the mesh has the slice's replicas x partitions
(``docs/device-layout.md``).

Multislice (``gcp.slices`` / ``local.slices``): T5X's own DCN settings, the slices as the outer ``replica``
axis of the mesh and model parallelism within a slice (:mod:`tpuft.worker.t5x.multislice`; ``check`` refuses a
``num_partitions`` that does not divide one slice's devices).

Pins (tested together on Python 3.11 and in CI, see ``../shared/wheels/README.md`` for how they were found):
jax/jaxlib 0.10.2 need Python >= 3.11 (jax >= 0.11 needs 3.12). The TPU VM images built on Ubuntu 22.04
(``tpu-ubuntu2204-base``, ``v2-alpha-tpuv4-pod``, ``v2-alpha-tpuv5``/``v6e``) ship Python 3.10, where jaxlib
stops at 0.6.2: ``tpuft setup`` then builds the venv from a newer interpreter found on the worker (python3.12
or 3.11: seqio's editdistance has no 3.13 wheel) and, when there is none, stops with what to install
(``gcp.python`` names the interpreter to use). t5x, airio and jestimator are not on PyPI and name their git
dependencies unpinned, so they are installed with ``--no-deps`` after the pinned PyPI set: from their git
repositories at the tested commits, or from ``backend.t5x_source``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuft.backends.base import ClusterShape, EnvSpec, KeyPath, LaunchPlan, Target
from tpuft.backends.spec import LOCAL_DEVICES_ENV, RunOutcome, compile_cache_env
from tpuft.backends.t5x_schema import (
    CAPABILITIES,
    LAYOUT,
    PRETRAINING_LOSS_FACTOR,
    SENTINELS_BUILT_IN,
    Family,
    Size,
    T5xBackend,
    checkpoint_step,
    gin_value,
    microbatches,
    model_gins,
    sentencepiece_last_piece,
)

if TYPE_CHECKING:
    from tpuft.config.recipe import RecipeConfig

__all__ = [
    "AIRIO_COMMIT",
    "BACKEND",
    "CAPABILITIES",
    "GIT_SOURCES",
    "JAX_VERSION",
    "JESTIMATOR_COMMIT",
    "LAYOUT",
    "MAX_PYTHON",
    "MIN_PYTHON",
    "PINNED",
    "PRETRAINING_LOSS_FACTOR",
    "SENTINELS_BUILT_IN",
    "SOURCE_PACKAGES",
    "T5X_COMMIT",
    "Family",
    "Size",
    "T5x",
    "T5xBackend",
    "checkpoint_step",
    "gin_value",
    "model_gins",
    "sentencepiece_last_piece",
    "source_digest",
    "source_requirements",
]

T5X_COMMIT = "cc342d419ec3e3e9c4bf1df33c82330cafdc1e16"
AIRIO_COMMIT = "69897df7d9a427b947a9f7bb4164c7782b43e601"
JESTIMATOR_COMMIT = "326824a477feef6d92e6f44175000907a72899ca"
GIT_SOURCES = (
    f"t5x @ git+https://github.com/google-research/t5x@{T5X_COMMIT}",
    f"airio @ git+https://github.com/google/airio@{AIRIO_COMMIT}",
    f"jestimator @ git+https://github.com/google-research/jestimator@{JESTIMATOR_COMMIT}",
)
"""What a user's workers install by default: the upstream repositories at the commits tpuft is tested with."""
SOURCE_PACKAGES = ("t5x", "airio", "jestimator")

JAX_VERSION = "0.10.2"
MIN_PYTHON = "3.11"
MAX_PYTHON = "3.12"
"""seqio needs editdistance, which has no wheel for 3.13 (tests/backends/test_tpu_install_sets.py resolves
3.13 to show it)."""
PINNED = (
    "flax==0.12.8",
    "orbax-checkpoint==0.12.8",
    "tensorstore==0.1.86",
    "seqio==0.0.20",
    "gin-config==0.5.0",
    "clu==0.0.12",
    "fiddle==0.3.1",
    "optax==0.2.8",
    "chex==0.1.92",
    "jaxtyping==0.3.11",
    "grain==0.2.18",
    "cached_property",
    "tensorflow-cpu==2.21.0",  # seqio's input pipelines; the CPU wheel on TPU hosts too (JAX owns the chips)
    "tensorflow-text==2.21.1",
    "tensorflow-datasets==4.9.10",
    "tensorboard",  # TF 2.21 no longer pulls it in, and `import t5x` needs it
    "sentencepiece>=0.2",
    "numpy>=1.26",
    "pydantic>=2.6",
    "pyyaml>=6",
    "google-cloud-storage>=2.14",  # the worker mirrors a gs:// run dir and reads gs:// checkpoints to export
    "datasets>=4.0,<6",  # data.hf as a seqio source (tpuft/worker/t5x/data.py through hf_data.py); resolves
    # with the pins above, no downgrade; gcsfs: data.hf.data_files on gs://, read through fsspec
    "gcsfs>=2024.2",
)
"""The PyPI set that installs and trains with t5x at ``T5X_COMMIT`` (Python 3.11, CPU and TPU)."""


def source_requirements(source: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(requirements installed with --no-deps, local paths they name) for ``backend.t5x_source``."""
    if source is None:
        return GIT_SOURCES, ()
    path = Path(source)
    if path.is_dir() and not (path / "setup.py").exists() and not (path / "pyproject.toml").exists():
        wheels = sorted(path.glob("*.whl"))
        named = []
        for package in SOURCE_PACKAGES:
            found = [w for w in wheels if w.name.split("-")[0].lower() == package]
            named.append(str(found[-1]) if found else next(g for g in GIT_SOURCES if g.startswith(package)))
        return tuple(named), tuple(n for n in named if n.startswith("/"))
    return (str(path), *GIT_SOURCES[1:]), (str(path),)


def source_digest(paths: tuple[str, ...]) -> str:
    """Content hash of the local sources, so that a changed wheel or checkout gives a new venv."""
    digest = hashlib.sha256()
    for text in paths:
        path = Path(text)
        files = (
            sorted(p for p in path.rglob("*") if p.is_file() and ".git" not in p.parts)
            if path.is_dir()
            else [path]
        )
        for file in files:
            digest.update(str(file.relative_to(path.parent)).encode())
            try:
                digest.update(hashlib.sha256(file.read_bytes()).digest())
            except OSError:
                digest.update(b"?")
    return digest.hexdigest()[:16]


class T5x:
    kind = "t5x"
    config_model = T5xBackend
    layout = LAYOUT
    capabilities = CAPABILITIES

    def env_spec(self, backend_config: object, target: Target, python: str) -> EnvSpec:
        assert isinstance(backend_config, T5xBackend)
        jax = f"jax[tpu]=={JAX_VERSION}" if target == "tpu" else f"jax=={JAX_VERSION}"
        no_deps, local = source_requirements(backend_config.t5x_source)
        requirements = (jax, f"jaxlib=={JAX_VERSION}", *PINNED, *backend_config.extra_requirements)
        return EnvSpec(
            kind=self.kind,
            requirements=requirements,
            python=python,
            no_deps=no_deps,
            min_python=MIN_PYTHON,
            max_python=MAX_PYTHON,
            local_sources=local,
            sources_digest=source_digest(local) if local else "",
        )

    @staticmethod
    def devices(shape: ClusterShape) -> int:
        """Every device of the run: the slice's chips on TPU; on the local pod each worker's CPU devices
        (``local.devices_per_worker``, the slice's chips per host by default), so the layout is the
        slice's."""
        return shape.chips if shape.target == "tpu" else shape.hosts * shape.local_devices

    @classmethod
    def data_parallel(cls, recipe: RecipeConfig, shape: ClusterShape) -> int:
        """Data-parallel replicas: every device over the model-parallel partitions."""
        return max(1, cls.devices(shape) // recipe.backend.num_partitions)

    def check(self, recipe: RecipeConfig, shape: ClusterShape) -> list[tuple[KeyPath, str]]:
        found: list[tuple[KeyPath, str]] = []
        backend = recipe.backend
        devices = self.devices(shape)
        partitions = backend.num_partitions
        if devices % partitions:
            found.append(
                (("backend", "num_partitions"), f"{partitions} does not divide the {devices} devices")
            )
            return found
        if shape.slices > 1 and (devices // shape.slices) % partitions:
            # The slices are joined by the data-centre network only: T5X's mesh puts them on the outer
            # `replica` axis, and a partition group (whose collectives run every layer) must sit on one
            # slice's fast links.
            found.append(
                (
                    ("backend", "num_partitions"),
                    f"{partitions} does not divide the {devices // shape.slices} "
                    f"devices of one slice ({shape.slices} slices): model parallelism stays within a slice",
                )
            )
            return found
        per_worker = shape.local_devices
        if shape.target == "cpu" and partitions % per_worker and per_worker % partitions:
            # A partition group must be whole workers, or lie within one: the mesh is cut from the devices in
            # worker order, and T5X feeds each worker the rows of the replicas its devices hold.
            found.append(
                (
                    ("backend", "num_partitions"),
                    f"{partitions} partitions do not tile the local workers' "
                    f"{per_worker} devices each (local.devices_per_worker): use a divisor or a multiple of "
                    f"{per_worker}",
                )
            )
            return found
        replicas = self.data_parallel(recipe, shape)
        micro = microbatches(recipe)  # train.grad_accum_steps or backend.num_microbatches: T5X's one setting
        step = replicas * (micro or 1)
        if recipe.train.batch_size % step:
            what = f"{replicas} data-parallel replicas" + (
                f" ({shape.slices} slices x {replicas // shape.slices})" if shape.slices > 1 else ""
            )
            what += f" x {micro} microbatches" if micro else ""
            found.append(
                (
                    ("train", "batch_size"),
                    f"{recipe.train.batch_size} does not split evenly over {what} (use a multiple of {step})",
                )
            )
        data = recipe.data
        evaluates = backend.task == "finetune" and (
            data.eval is not None or bool(data.hf and data.hf.eval_split)
        )
        if (
            evaluates and recipe.eval.batch_size % replicas
        ):  # T5X's inference eval splits its batch the same way
            found.append(
                (
                    ("eval", "batch_size"),
                    f"{recipe.eval.batch_size} does not split evenly over {replicas} "
                    f"data-parallel replicas (use a multiple of {replicas}; T5X pads the last batch)",
                )
            )
        return found

    def plan(self, recipe: RecipeConfig, shape: ClusterShape) -> LaunchPlan:
        env = {"TF_CPP_MIN_LOG_LEVEL": "2", "TOKENIZERS_PARALLELISM": "false"}
        env.update(compile_cache_env(recipe.train.compile_cache, self.kind, shape.target))
        if shape.target == "cpu":
            env["JAX_PLATFORMS"] = "cpu"
            # the trainer adds it to XLA_FLAGS as a host device count
            env[LOCAL_DEVICES_ENV] = str(shape.local_devices)
        ship = ("train", "eval", "test", "preprocess", "corpus", "backend.gin_files", "backend.vocabulary")
        return LaunchPlan(workers=tuple(range(shape.hosts)), env=env, ship=ship)

    def summarize(self, outcome: RunOutcome, launched: int) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """The best checkpoint by the eval metric: kept besides the last ones, and the one export/hf is made
        from."""
        best = outcome.best_metric
        if best is None:
            return {}, []
        name, value, step = best
        folder = LAYOUT.checkpoint_format.format(step=step)
        return {"best_checkpoint": {"name": folder, "metric": name, "value": value}}, [
            ("best checkpoint", f"{folder} ({name.removeprefix('eval_')} {value:.4f})")
        ]


BACKEND = T5x()
