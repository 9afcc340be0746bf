"""The recipe's ``report:`` section: which experiment trackers a run's metrics go to besides TensorBoard.

TensorBoard events are always written (one backend writes them itself, and tpuft's own readers use them), so
``to`` only adds trackers. W&B and MLflow are fed by a sidecar process on the chief
(:mod:`tpuft.worker.tracking.sidecar`), never by the trainer: a tracker's network calls cannot slow or crash
training, and the trackers' packages live in a venv of their own (:mod:`tpuft.config.tracking_env`), built
only when a recipe names one. Pydantic and the stdlib only: the worker reads this section too.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from tpuft.core.config_types import StrictModel, listed_once

Tracker = Literal["tensorboard", "wandb", "mlflow"]
SIDECAR_TRACKERS = ("wandb", "mlflow")
"""The trackers the sidecar feeds (TensorBoard is the trainers' own)."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
_TAG = re.compile(r"[^\x00-\x1f]{1,64}")
MLFLOW_SCHEMES = ("file:", "sqlite:", "http:", "https:")


class WandbConfig(StrictModel):
    project: str = Field("tpuft", description="The W&B project the run goes to.")
    entity: str | None = Field(None, description="The W&B team or user; default: the API key's own.")
    mode: Literal["online", "offline"] = Field(
        "online",
        description="online: to the W&B server (WANDB_API_KEY through the cluster's worker_env); "
        "offline: files in the run dir's wandb/ folder, uploaded later with `wandb sync`.",
    )
    group: str | None = Field(None, description="The W&B group (e.g. one per sweep).")
    tags: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Extra W&B tags (tpuft adds the backend, accelerator and run id).",
    )
    notes: str | None = Field(None, max_length=10_000, description="The W&B run's notes.")

    @field_validator("project", "entity", "group")
    @classmethod
    def _named(cls, value: str | None) -> str | None:
        if value is not None and not _NAME.fullmatch(value):
            raise ValueError(f"{value!r}: letters, digits, '_', '.' or '-' (128 at most)")
        return value

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: list[str]) -> list[str]:
        bad = [tag for tag in value if not _TAG.fullmatch(tag)]
        if bad:
            raise ValueError(f"{bad[0]!r}: a tag is 1 to 64 printable characters")
        return value


class MlflowConfig(StrictModel):
    tracking_uri: str | None = Field(
        None,
        description="Where the MLflow run goes: file:PATH, sqlite:///PATH.db (a relative PATH is resolved "
        "on the chief against the run dir) or http(s)://server; default: MLFLOW_TRACKING_URI in "
        "the worker's environment (the cluster's worker_env), else sqlite:///mlflow.db in the "
        "run dir.",
    )
    experiment: str = Field(
        "tpuft", max_length=500, description="The MLflow experiment (created when missing)."
    )

    @field_validator("tracking_uri")
    @classmethod
    def _uri(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(MLFLOW_SCHEMES):
            raise ValueError(f"{value!r}: give a file:, sqlite:, http: or https: URI")
        if value is not None and any(ch.isspace() for ch in value):
            raise ValueError(f"{value!r}: a URI has no spaces")
        return value

    @field_validator("experiment")
    @classmethod
    def _experiment(cls, value: str) -> str:
        if not value.strip() or any(ord(ch) < 32 for ch in value):
            raise ValueError("must be a non-empty name of printable characters")
        return value


class ReportConfig(StrictModel):
    to: list[Tracker] = Field(
        default_factory=lambda: ["tensorboard"],
        description="Where metrics go: tensorboard (always written), wandb, mlflow. W&B and MLflow are "
        "fed from metrics.jsonl by a sidecar on the chief; see docs/tracking.md.",
    )
    wandb: WandbConfig = Field(
        default_factory=WandbConfig, description="W&B settings (used when `to` names wandb)."
    )
    mlflow: MlflowConfig = Field(
        default_factory=MlflowConfig, description="MLflow settings (used when `to` names mlflow)."
    )
    samples: int = Field(
        20,
        ge=0,
        le=10_000,
        description="Rows of the prediction-samples table logged at the end (the test predictions, else the "
        "eval samples).",
    )

    @field_validator("to")
    @classmethod
    def _once(cls, value: list[str]) -> list[str]:
        return listed_once(value)

    @property
    def trackers(self) -> tuple[str, ...]:
        """The trackers the sidecar feeds, in the order given; () when only TensorBoard is asked for."""
        return tuple(name for name in self.to if name in SIDECAR_TRACKERS)
