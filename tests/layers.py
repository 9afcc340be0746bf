"""The layers of ``tpuft/``, once, as data: which modules belong to each and which layers each may import.

Two readers, so that the rule and its description cannot drift apart: ``tests/test_layering.py`` checks
every import arrow of the package against it, and ``docs/gen_architecture.py`` writes the layer table and its
diagram in docs/ARCHITECTURE.md from it (``tests/test_docs.py`` fails when the page is stale).

A layer names the layers directly below it that it imports (``imports``); it may import those and everything
they may import (the closure), never a layer above it or beside it. So the diagram, one arrow per ``imports``
entry, is the whole rule: a layer may import exactly what its arrows reach.

A module belongs to the layer whose pattern names it most closely: an exact name (``tpuft.backends.spec``)
before a pattern (``tpuft.backends.*``, every module below ``tpuft.backends``), a longer pattern before a
shorter one. Patterns name packages, never a backend, so a new backend's files fall into their layers by
themselves.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from functools import cache


def package(name: str) -> tuple[str, str]:
    """A package's ``__init__`` and every module below it."""
    return (name, f"{name}.*")


@dataclass(frozen=True)
class Layer:
    name: str
    members: tuple[str, ...]
    """Module patterns (exact dotted names, or ``fnmatch`` patterns such as ``tpuft.fleet.*``)."""
    imports: tuple[str, ...]
    """The layers directly below that this one imports; it may import their closure too."""
    modules: str
    """What lives here, for the table (Markdown)."""


LAYERS: tuple[Layer, ...] = (
    Layer(
        "foundations",
        ("tpuft", *package("tpuft.core"), *package("tpuft.run"), "tpuft.model", "tpuft.model.t5_config"),
        (),
        "`core/` (errors, `$TPUFT_HOME` paths, name and path formats, bounded YAML 1.2, checked config "
        "types, the cluster records `Worker`/`Cluster`/`SliceLayout`, ports, waits that say what they wait "
        "for, the TPU catalogue and its zones per generation (`tpu_zones`), Compute Engine's TPU machine "
        "types and images (`compute_tpus`), templates, `fetch.py` beside data); `run/`: the run-directory "
        "contract (`rundir`, below), the goodput timeline, cost, maintenance windows and the checkpoint "
        "asked before one (`maintenance_asks`), start-up (`startup`: which trainers are not up yet), the "
        "predict job (`predict_job`: the job and the `Engine` contract); `model/t5_config.py` (the "
        "`model.config` schema). The standard library, pydantic and PyYAML",
    ),
    Layer(
        "storage",
        package("tpuft.storage"),
        ("foundations",),
        "`storage/`: the `Storage` interface over a local folder and `gs://` (`base`, `local`, `gcs`, "
        "`network`: the budget and each cloud call's wait, `google_errors`: what a project lacks, "
        "`transfer`, `errors`, `sync`)",
    ),
    Layer(
        "shared",
        (
            *package("tpuft.data"),
            *package("tpuft.scoring"),
            *package("tpuft.host"),
            "tpuft.run.predict_parts",
        ),
        ("storage",),
        "What the controller and the workers both run, so neither imports the other for it. `data/`: the one "
        "reader of training data (`files`: JSON lines, CSV, TSV, Parquet, `.gz`, local or `gs://`; "
        "`examples`: fields, templates, the text checks, shards, batches), `text_transforms` (the recipe's "
        "transforms and preprocess hook), `predict_input` (a predict input through the training data's "
        "fields). `scoring/`: `predictions` (the predictions files, summable statistics, scores) and "
        "`text_metrics` (BLEU, ROUGE-L). `host/`: the stdlib scripts the controller ships and runs with a "
        "host's base python (`bootstrap`: builds the venv; `doctor_probe`), the host's `state` (the "
        "supervisor's folder, TPU device files, processes), the supervisor's command line "
        "(`supervisor_cli`), the launch variables (`launch_env`). `run/predict_parts.py`: a predict job's "
        "shards folder and the join, run by worker 0 or by the controller",
    ),
    Layer(
        "records",
        ("tpuft.backends", "tpuft.backends.spec", "tpuft.backends.registry"),
        ("storage",),
        "`backends/spec.py` (the plain records a backend states: `EnvSpec`, `ClusterShape`, `LaunchPlan`, "
        "`RunLayout` with the checkpoint manifest, `Capabilities`, `RunOutcome`), `backends/registry.py` "
        "(kind → modules: `schema(kind)`, `config_models()`, `capabilities()`, `layout(kind)`, "
        "`compile_planner(kind)`; by name, through `importlib`), `backends/__init__.py` (the registry only)",
    ),
    Layer(
        "config",
        package("tpuft.config"),
        ("records",),
        "`config/`: `cluster.py` (the cluster schema), `data.py`, `report.py` (`report.to`), `recipe.py` "
        "(the recipe schema, and `capability_problems`, the one check of the backends' capabilities), "
        "`loader.py` (YAML with lines, `--set`, located errors, `Checked` and `Problems`) with `wording.py` "
        "(pydantic's errors in the user's words) and `validation.py` (a file with problems validated as "
        "far as it goes: every problem in one pass), `tracking_env.py` (the trackers' venv); "
        "each backend's recipe section through the registry, by name",
    ),
    Layer(
        "schemas",
        ("tpuft.backends.*_schema",),
        ("config",),
        "`backends/<kind>_schema.py`, each backend's light part: `SECTION` (its `backend:` keys), "
        "`CAPABILITIES`, `LAYOUT`, and what its worker shares with its planner (T5X's gin helpers). What the "
        "converters and the workers import of a backend",
    ),
    Layer(
        "backends",
        ("tpuft.backends.*",),
        ("schemas",),
        "`backends/base.py` (the `Backend` protocol, `CompilePlan`, `get_backend(kind)`, shared helpers), "
        "`backends/<kind>.py` (the planning part: venv, cluster check, launch plan, summary), "
        "`backends/<kind>_compile.py` (an offline compile plan, T5X only), `backends/matrix.py` (the "
        "capability matrix)",
    ),
    Layer(
        "fleet",
        package("tpuft.fleet"),
        ("foundations",),
        "`fleet/`: `base` (the Fleet contract), `local`, `ssh` with `ssh_config`, `ssh_direct`, `pacing`, "
        "`ssh_progress` (the handshakes' line, the unreachable workers' one error) and `ssh_remote`, "
        "`supervise` (fail-fast, Ctrl-C), `spec` (worker selections). A leaf: only "
        "`core.records`, `core.errors` and `core.waiting` (its own test)",
    ),
    Layer(
        "providers",
        package("tpuft.providers"),
        ("config", "fleet"),
        "`providers/`: `base` (the Provider contract), `local`, `gcp/` (`api`, `nodes`, `maintenance` for "
        "the Cloud TPU API; `compute_api`, `compute_slices` for Compute Engine; "
        "`buckets`, `access`, `cache`, `exec_plan`, `tuning`, `provider`), `ssh_keys`",
    ),
    Layer(
        "model",
        ("tpuft.model.*",),
        ("config",),
        "`model/`: `shapes.py`, `recipe_model.py` (which model a recipe trains: hub id, config.json, "
        "`model.config`, a T5X family), `summary.py` (a recipe's paper summary), `gin_network.py` (the T5 "
        "network a "
        "T5X gin builds), `fsdp_plan.py` (also the PyTorch/XLA trainer's sharding)",
    ),
    Layer(
        "convert",
        package("tpuft.convert"),
        ("schemas",),
        "`convert/`: T5X (legacy and Orbax), torch and Keras/TF checkpoints (`keras_weights`: a TF "
        "checkpoint's files read) → HF safetensors, `verify`; "
        "`remote.py` asks the backends' `RunLayout`s (through the registry) what to fetch",
    ),
    Layer(
        "readers",
        package("tpuft.readers"),
        ("providers",),
        "`readers/`: `runs.py` (a Run: resolve by prefix, list, the one local mirror, snapshot, status), "
        "`monitor.py` (asks the provider for the node's state), `plot.py`, `tb_events.py`",
    ),
    Layer(
        "worker",
        package("tpuft.worker"),
        ("shared", "schemas", "model", "convert"),
        "Shipped to every host, run in the backend venv: `worker/`: `__main__`, `context`, `compile_cache`, "
        "`loop/` "
        "(the run sequencer and its state), `export`, `metrics`, `resume`, `selection`, `schedule`, "
        "`events`, "
        "`ondemand`, `multislice`, `hf_data` with `hf_read` (a Hugging Face split read in parts); the "
        "engine rooms `keras/`, `t5x/`, `torch_xla/` (`train.py` and its parts, `testset.py`, `predict.py`; "
        "PyTorch/XLA's `state` and `feed`); `supervisor/` (`process`, `supervision`, `maintenance`, "
        "`cost_guard`); `predict/` (`main`, `loop`, `hf`); `tracking/` (`sidecar`, `sinks`, `launch`). "
        "**Never** the controller's layers",
    ),
    Layer(
        "ops",
        package("tpuft.ops"),
        ("shared", "backends", "providers", "model", "convert", "readers"),
        "`ops/`: one module per verb (`cluster`, `setup`, `train`, `up`, `lifecycle`, `recover`, `logs`, "
        "`pull`, `convert`, `tensorboard`, `recipes`, `preflight`, `plan`, `compile_fit`, `doctor`, "
        "`ondemand`, `maintenance`, `gc` (with `gc_compute` and the `leaks` both report), `drill`, "
        "`quick_exec`, `predict`, `predict_launch`, "
        "`predict_shards`, `common`) and their parts (`trainer_env`: what every launched trainer is told; "
        "`ship_data`: the data shipped to the workers; `watcher_lease`: the recovery watcher's lease; "
        "`doctor_checks`: the verdicts on a host's probe report; `compile_triage` and `compile_preflight`: "
        "what `compile_fit` decides and checks before a compile), and the warm-connection agent (`agent`, "
        "`agent_client`)",
    ),
    Layer(
        "cli",
        (*package("tpuft.cli"), "tpuft.commands", "tpuft.launcher", "tpuft.__main__"),
        ("ops",),
        "`cli/` (Typer, one module per panel, `render`, `tables`: every table fitted to the terminal, "
        "`options`), `commands.py` (the one verb table), `launcher.py` (the entry point), `__main__.py`. "
        "Nothing imports it",
    ),
)
"""Bottom up: a layer's ``imports`` name only layers before it."""

BY_NAME = {layer.name: layer for layer in LAYERS}


def _specificity(pattern: str) -> tuple[int, int]:
    """An exact name before any pattern; then the pattern with more literal characters first
    (``tpuft.backends.*_schema`` before ``tpuft.backends.*``)."""
    wild = any(mark in pattern for mark in "*?[")
    return (0 if wild else 1, len(pattern.replace("*", "").replace("?", "")))


def layer_of(module: str) -> str | None:
    """The layer of a dotted module name (None: no pattern names it)."""
    best: tuple[tuple[int, int], str] | None = None
    for layer in LAYERS:
        for pattern in layer.members:
            if fnmatch.fnmatchcase(module, pattern):
                rank = (_specificity(pattern), layer.name)
                if best is None or rank[0] > best[0]:
                    best = rank
    return None if best is None else best[1]


@cache
def allowed(name: str) -> frozenset[str]:
    """The layers ``name`` may import: itself, and the closure of its ``imports``."""
    reach = {name}
    for below in BY_NAME[name].imports:
        reach |= allowed(below)
    return frozenset(reach)
