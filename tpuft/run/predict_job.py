"""What a ``tpuft predict`` job asks of its workers, and what a backend's prediction engine offers: the
contract between the controller (``tpuft/ops/predict.py``), the shared shard loop
(``tpuft/worker/predict/loop.py``) and each backend's engine (``tpuft/worker/<kind>/predict.py``, and
``worker/predict/hf.py`` for a Hugging Face model).

The input is cut into shards of ``shard_lines`` consecutive lines (shard ``k``: lines ``k*shard_lines`` to
``(k+1)*shard_lines - 1``, 0-based). Every shard is predicted by all the job's processes together, each taking
its part (line ``i`` of the shard goes to process ``i % processes``), so engines that compute in lock-step
(SPMD) call their step the same number of times on every process. A process writes its part to
``<shards>/shard-<k:06d>/predictions-<process:05d>.jsonl`` (whole, through a temp name); a shard is done when
every part is there, and a resumed job skips it. The parts are joined into ``output`` in input order.

Stdlib only: it runs in every backend's venv and on the controller.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass
from typing import Any, Protocol

JOB_FILE = "job.json"
"""The job's record in its shards folder: a resumed job must be the same job (same input, model and
settings)."""

SHARD_LINES = 10_000

JOB_ENV = "TPUFT_PREDICT_JOB"
"""The job's JSON in every predicting process's environment (the controller sets it, the entry reads it)."""


@dataclass(frozen=True)
class PredictJob:
    input: str
    """The input file: JSON lines, CSV or TSV (by its suffix), local or ``gs://``."""
    shards: str
    """The folder (local, or a ``gs://`` prefix) the shards are written to."""
    output: str | None
    """Where the joined predictions go (local or ``gs://``); None: the controller joins (its disk)."""
    backend: str
    """The engine: a backend kind, or ``hf`` (a Hugging Face model folder, with transformers and torch)."""
    model: str
    """What the engine loads: a checkpoint folder of the backend (or an HF model folder), local or
    ``gs://``."""
    recipe: str
    """The resolved recipe's YAML text: the data fields, prefix, templates, transforms, labels and lengths."""
    field: str | None = None
    """``--field``: the input field, instead of the recipe's ``source_field`` / ``source_template``."""
    num_beams: int = 1
    max_new_tokens: int | None = None
    """None: the recipe's ``data.max_target_length``."""
    batch_size: int = 32
    """Examples per process per step."""
    shard_lines: int = SHARD_LINES
    total_lines: int | None = None
    """The input's line count when the controller counted it (for the progress bar's total and ETA)."""
    # the attribute `field` shadows the function
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Anything else a backend's engine reads (e.g. the device: ``{"device": "cpu"}``)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PredictJob:
        return cls(**json.loads(text))

    def same_work(self, other: PredictJob) -> list[str]:
        """The fields that make ``other`` a different job (a resume must not mix two models' predictions)."""
        keys = ("input", "backend", "model", "field", "num_beams", "max_new_tokens", "shard_lines")
        return [key for key in keys if getattr(self, key) != getattr(other, key)]


class Engine(Protocol):
    """A backend's prediction engine, built once per process from the job's model.

    ``predict`` gets the processed inputs (the recipe's prefix, template and transforms applied) of up to
    ``job.batch_size`` examples and returns one prediction per input, as text: the decode (greedy, or beam
    search with ``job.num_beams``, at most ``max_new_tokens`` tokens), or for a classifier the name of the
    label the argmax (taken on the device) picked. An engine that computes in lock-step pads to its static
    batch itself: the loop calls ``predict`` the same number of times on every process, sometimes with fewer
    inputs (or none)."""

    def predict(self, sources: list[str]) -> list[str]: ...

    def close(self) -> None: ...
