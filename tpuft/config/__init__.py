"""The two files a user writes: the cluster file (``tpuft.yaml``) and a recipe (``NAME.yaml``;
the shipped ones are package data in ``tpuft/recipes/``).

Both are pydantic models with ``extra="forbid"`` and strict types (YAML ``true`` is not 1, ``1.5`` is not an
int, numbers are finite and bounded). Loading keeps a map from every key path to its YAML line, so each
problem is reported as ``file:line: key.path: what is wrong (got X)``, all problems at once, exit code 2,
before anything runs. ``--set a.b=c`` overrides are applied to the raw YAML first and located as ``--set
a.b``. The YAML itself is read by
:mod:`tpuft.core.safe_yaml` (bounded size, depth and alias expansion; YAML 1.2 scalars).

Three parts: :mod:`~tpuft.config.cluster` (the cluster schema), :mod:`~tpuft.config.recipe` with
:mod:`~tpuft.config.data` (the recipe schema; each backend's section comes from its
``backends/<kind>_schema.py`` through the registry) and :mod:`~tpuft.config.loader` (YAML with lines,
``--set``, located errors), with :mod:`~tpuft.config.validation` (a file with problems validated as far as it
goes, so that every problem of both files is found in one pass). The names below are re-exported so that
``from tpuft.config import X`` reads the same everywhere.

This package is imported on the worker too (inside the backend venv), so it depends on pydantic and PyYAML
only.
"""

from __future__ import annotations

from tpuft.config.cluster import (
    ClusterConfig,
    GcpConfig,
    LocalConfig,
    RecoverConfig,
    SshConfig,
    expand_env_tokens,
    parse_duration,
)
from tpuft.config.data import DataConfig, HfDataset, TransformName
from tpuft.config.loader import (
    DEFAULT_CLUSTER_FILE,
    MAX_OVERRIDE_CHARS,
    Checked,
    Loaded,
    Problems,
    check_cluster,
    check_recipe,
    cluster_file,
    dump_recipe,
    load_cluster,
    load_recipe,
    parse_overrides,
    recipe_from_text,
    recipe_suggestion,
    resolve_recipe_path,
)
from tpuft.config.recipe import (
    AdafactorSettings,
    Backend,
    EarlyStopping,
    EvalConfig,
    EvalMetric,
    ExportConfig,
    ModelConfig,
    PromptTuning,
    RecipeConfig,
    TrainConfig,
    capability_problems,
)
from tpuft.core.config_types import KeyPath, StrictModel

__all__ = [
    "DEFAULT_CLUSTER_FILE",
    "MAX_OVERRIDE_CHARS",
    "AdafactorSettings",
    "Backend",
    "Checked",
    "ClusterConfig",
    "DataConfig",
    "EarlyStopping",
    "EvalConfig",
    "EvalMetric",
    "ExportConfig",
    "GcpConfig",
    "HfDataset",
    "KeyPath",
    "Loaded",
    "LocalConfig",
    "ModelConfig",
    "Problems",
    "PromptTuning",
    "RecipeConfig",
    "RecoverConfig",
    "SshConfig",
    "StrictModel",
    "TrainConfig",
    "TransformName",
    "capability_problems",
    "check_cluster",
    "check_recipe",
    "cluster_file",
    "dump_recipe",
    "expand_env_tokens",
    "load_cluster",
    "load_recipe",
    "parse_duration",
    "parse_overrides",
    "recipe_from_text",
    "recipe_suggestion",
    "resolve_recipe_path",
]
