"""``tpuft predict SOURCE --input IN --output OUT``: what a prediction job is, checked before anything is
launched.

The source is a training run (its best checkpoint under ``train.keep_best``, else its last complete one), a
checkpoint folder of a run, or a Hugging Face model folder. The input is read through here first, the way the
workers will read it (:func:`tpuft.data.predict_input.check`): a bad line is a located error, every one at
once, before a worker is asked for anything. Then the output's rules: an existing OUT (or an earlier job's
shards) is refused unless ``--resume`` (the same job: :meth:`PredictJob.same_work`; its finished shards are
kept) or ``--overwrite`` (its shards are removed first).

Where the job runs is the caller's choice: ``--local`` (:func:`run_local`: the Hugging Face export on this
machine's CPU, in the Python ``convert --verify`` uses) or the cluster (:mod:`tpuft.ops.predict_launch`: a run
of its own under the workers' supervisors). Both write shards that a killed job resumes from and join them
into OUT in input order.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuft.config import ClusterConfig, RecipeConfig, load_recipe, recipe_from_text
from tpuft.core.errors import ConfigError, TpuftError, UsageError
from tpuft.data import DataError, predict_input
from tpuft.data.text_transforms import HookError
from tpuft.ops.predict_shards import Progress, ProgressWatch, join_output
from tpuft.readers.runs import Run, layout_for, resolve_run
from tpuft.run import rundir
from tpuft.run.predict_job import JOB_FILE, SHARD_LINES, PredictJob
from tpuft.storage import open_storage

HF_ENGINE = "hf"
"""The engine of a Hugging Face model folder (any backend's export): transformers and torch."""
WORKER_MODULE = ("-m", "tpuft.worker.predict.main")


@dataclass(frozen=True)
class PredictOptions:
    """The command's options, as the user gave them."""

    input: str
    output: str
    field: str | None = None
    num_beams: int = 1
    max_new_tokens: int | None = None
    batch_size: int = 32
    shard_lines: int = SHARD_LINES
    local: bool = False
    resume: bool = False
    overwrite: bool = False
    recipe: Path | None = None
    """``--recipe``: the fields, prefix and lengths for a source that is not (inside) a run."""
    overrides: tuple[str, ...] = ()
    processes: int | None = None
    """``--local``'s engine processes (default :func:`local_processes`)."""


@dataclass(frozen=True)
class Source:
    """What predicts: the backend's engine and the model folder it loads, with the recipe it was trained
    by."""

    kind: str
    """``run``, ``checkpoint`` or ``hf``."""
    backend: str
    """The recipe's backend kind, or :data:`HF_ENGINE` for a Hugging Face model folder."""
    model: str
    """The folder the engine loads (local or ``gs://``)."""
    recipe: RecipeConfig
    recipe_text: str
    run: Run | None = None
    step: int | None = None
    notes: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        if self.run is not None and self.step is not None:
            return f"run {self.run.id}, checkpoint of step {self.step}"
        return self.model


@dataclass
class PredictResult:
    output: str
    rows: int
    seconds: float
    scores: dict[str, Any] = field(default_factory=dict)
    """The input's targets against the predictions (empty when it had none): :func:`predictions.scores`."""
    run_id: str | None = None
    """The cluster run that predicted (None: ``--local``)."""
    shards: str = ""
    resumed_shards: int = 0
    """Shards an earlier job had finished, kept."""
    detached: bool = False

    @property
    def examples_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "output": self.output,
            "rows": self.rows,
            "seconds": round(self.seconds, 2),
            "examples_per_s": round(self.examples_per_s, 2),
            "scores": self.scores,
            "run_id": self.run_id,
            "shards": self.shards,
            "resumed_shards": self.resumed_shards,
            "detached": self.detached,
        }


# ----------------------------------------------------------------------------------------------------------
# The source


def resolve_source(config: ClusterConfig, text: str, options: PredictOptions) -> Source:
    """A run id or prefix (``latest`` too), else a checkpoint or Hugging Face model folder (local or
    ``gs://``)."""
    if text.startswith("gs://") or Path(text).expanduser().is_dir():
        return _folder_source(config, text, options)
    if "/" in text or text.startswith("."):
        raise UsageError(
            f"{text}: no such folder (SOURCE is a run id, a checkpoint folder or a Hugging Face model folder)"
        )
    run = _latest_training_run(config) if text == "latest" else resolve_run(config, text)
    return _run_source(run, options)


def _latest_training_run(config: ClusterConfig) -> Run:
    """``latest`` as a source: the newest run that trained (predict jobs are runs too)."""
    from tpuft.readers.runs import list_runs

    for run in reversed(list_runs(config)):
        if run.info().get("job") != "predict":
            return run
    return resolve_run(config, None)  # none: its error names the storage


def _run_source(run: Run, options: PredictOptions) -> Source:
    info = run.info()
    if info.get("job") == "predict":
        raise UsageError(
            f"run {run.id} is a predict job, not a training run: give the run that trained the model"
        )
    recipe, text = _run_recipe(run, options)
    layout = layout_for(info, run.storage)
    steps = layout.checkpoint_steps(run.storage)
    if not steps:
        raise UsageError(
            f"run {run.id} has no complete checkpoint to predict with",
            hint=f"Look: tpuft monitor {run.id}   (a run writes one every train.checkpoint_every steps)",
        )
    from tpuft.ops.pull import choose_checkpoints, eval_rows_of

    evals = eval_rows_of(run.storage.read_text(rundir.METRICS) or "") if recipe.train.keep_best else []
    chosen, notes = choose_checkpoints(
        "best" if recipe.train.keep_best else "latest", sorted(steps), evals, recipe.eval.metric
    )
    step = chosen[0]
    model = f"{run.url}/{layout.checkpoints}/{steps[step]}"
    return Source("run", recipe.backend.kind, model, recipe, text, run=run, step=step, notes=tuple(notes))


def _run_recipe(run: Run, options: PredictOptions) -> tuple[RecipeConfig, str]:
    if options.recipe is not None:
        return _given_recipe(options)
    text = run.storage.read_text(rundir.RECIPE)
    if text is None:
        raise UsageError(f"run {run.id}: {run.url}/{rundir.RECIPE} is missing; give the recipe with --recipe")
    return recipe_from_text(text, f"{run.url}/{rundir.RECIPE}", check_files=False), text


def _given_recipe(options: PredictOptions) -> tuple[RecipeConfig, str]:
    assert options.recipe is not None
    from tpuft.config import dump_recipe

    recipe = load_recipe(options.recipe, list(options.overrides), check_files=False).value
    return recipe, dump_recipe(recipe)


def _folder_source(config: ClusterConfig, text: str, options: PredictOptions) -> Source:
    url = text.rstrip("/") if text.startswith("gs://") else str(Path(text).expanduser().resolve())
    store = open_storage(url, project=config.gcp.project)
    if not store.exists("config.json") and not store.list():
        raise UsageError(f"{text}: no such folder, or an empty one")
    run_dir = _run_dir_above(url, config)
    if run_dir is not None:
        run = Run.from_url(run_dir, config.gcp.project)
        layout = layout_for(run.info(), run.storage)
        name = url.rsplit("/", 1)[-1]
        step = layout.step_of(name)
        recipe, recipe_text = _run_recipe(run, options)
        if step is not None and url.endswith(f"{layout.checkpoints}/{name}"):
            if step not in layout.checkpoint_steps(run.storage):
                raise UsageError(
                    f"{text}: the checkpoint of step {step} is not complete (still being written, or cut "
                    "off); give a complete one"
                )
            return Source("checkpoint", recipe.backend.kind, url, recipe, recipe_text, run=run, step=step)
        if store.exists("config.json"):
            return Source("hf", HF_ENGINE, url, recipe, recipe_text, run=run)
    if not store.exists("config.json"):
        raise UsageError(
            f"{text}: neither a checkpoint folder of a run nor a Hugging Face model folder (no config.json)"
        )
    if options.recipe is None:
        raise UsageError(
            f"{text} is a Hugging Face model folder outside a run: give the recipe whose fields, prefix "
            "and lengths its inputs follow with --recipe"
        )
    recipe, recipe_text = _given_recipe(options)
    return Source("hf", HF_ENGINE, url, recipe, recipe_text)


def _run_dir_above(url: str, config: ClusterConfig) -> str | None:
    """The run dir a checkpoint (``<run>/checkpoints/step_N``) or export (``<run>/export/hf``) folder is
    in."""
    parts = url.rstrip("/").rsplit("/", 2)
    if len(parts) < 3:
        return None
    run_dir = parts[0]
    store = open_storage(run_dir, project=config.gcp.project)
    return run_dir if store.exists(rundir.RECIPE) and store.exists(rundir.RUN_INFO) else None


def hf_model_for_local(source: Source, project: str | None) -> str:
    """``--local`` runs a Hugging Face model: the run's ``export/hf`` (fetched into the run's mirror when it
    is in a bucket), or the folder given. A checkpoint that is not one (T5X, Keras) has to be converted
    first."""
    if source.kind == "hf":
        folder = source.model
    elif source.run is not None and source.run.storage.exists(f"{rundir.EXPORT_HF}/config.json"):
        folder = f"{source.run.url}/{rundir.EXPORT_HF}"
    elif (
        not source.model.startswith("gs://")
        and (Path(source.model) / "config.json").is_file()
        and _has_weights(Path(source.model))
    ):
        folder = source.model
    else:
        where = source.run.id if source.run is not None else source.model
        raise UsageError(
            f"--local runs a Hugging Face model, and {where} has none (no {rundir.EXPORT_HF})",
            hint=f"Make it: tpuft convert --run {where}   or predict on the cluster (drop --local)",
        )
    if not folder.startswith("gs://"):
        return folder
    from tpuft.core.paths import tpuft_home

    local = tpuft_home() / "models" / hashlib.sha256(folder.encode()).hexdigest()[:16]
    open_storage(folder, project=project).fetch_tree("", local)
    return str(local)


def _has_weights(folder: Path) -> bool:
    return any(folder.glob("*.safetensors")) or (folder / "pytorch_model.bin").is_file()


# ----------------------------------------------------------------------------------------------------------
# The input


def check_input(
    source: Source, options: PredictOptions, progress: Progress | None = None
) -> predict_input.InputCheck:
    """Every record read as a worker will read it; all problems at once as one located ConfigError (exit
    2)."""
    data = source.recipe.data
    try:
        fields = predict_input.fields_for(data, options.field)
        checked = predict_input.check(
            options.input, fields, list(getattr(data, "labels", []) or []), progress=progress
        )
    except HookError as exc:
        raise UsageError(f"data.preprocess: {exc}") from None
    except DataError as exc:
        raise ConfigError([str(exc)], source=options.input) from None
    problems = [f"{p.where}: {p.message}" for p in checked.problems]
    if checked.more_problems:
        problems.append(f"{options.input}: ... and {checked.more_problems} more problem(s) like these")
    if problems:
        raise ConfigError(problems, source=options.input)
    if checked.records == 0:
        raise UsageError(f"{options.input} has no records to predict")
    return checked


def make_job(
    source: Source,
    options: PredictOptions,
    *,
    model: str,
    backend: str,
    input_url: str,
    shards: str,
    output: str | None,
    total: int,
    settings: dict[str, Any] | None = None,
) -> PredictJob:
    return PredictJob(
        input=input_url,
        shards=shards,
        output=output,
        backend=backend,
        model=model,
        recipe=source.recipe_text,
        field=options.field,
        num_beams=options.num_beams,
        max_new_tokens=options.max_new_tokens,
        batch_size=options.batch_size,
        shard_lines=options.shard_lines,
        total_lines=total,
        settings=settings or {},
    )


# ----------------------------------------------------------------------------------------------------------
# --local


MAX_LOCAL_PROCESSES = 8
"""Each process holds a copy of the model: more than a few is memory for little gain."""


def local_processes() -> int:
    """``--local``'s default: one engine process per CPU this process may use (at most
    :data:`MAX_LOCAL_PROCESSES`). A small seq2seq model's decode is a chain of small matrix products, where
    torch's threads help little and processes each on a core of their own scale
    (``benchmarks/predict.py``)."""
    return max(1, min(MAX_LOCAL_PROCESSES, len(os.sched_getaffinity(0))))


def local_settings(processes: int) -> dict[str, Any]:
    """The engine settings of ``processes`` processes sharing this machine's CPUs: torch threads split
    evenly."""
    return {"device": "cpu", "threads": max(1, len(os.sched_getaffinity(0)) // processes)}


def run_local(
    job: PredictJob,
    output: str,
    *,
    on_line: Callable[[str], None] | None = None,
    progress: Progress | None = None,
    resumed: int = 0,
    processes: int = 1,
) -> PredictResult:
    """The job in ``processes`` processes on this machine's CPU (the ``hf`` engine, each its share of every
    shard, as a worker's processes share it), then the join into OUT. One failing process stops the others."""
    from tpuft.convert.model_source import ConvertError
    from tpuft.convert.verify import find_verify_python
    from tpuft.core.paths import environ_with_package

    try:
        python = find_verify_python(None)
    except ConvertError as exc:
        raise UsageError(str(exc).replace("--verify needs", "--local needs")) from None
    env = environ_with_package()
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for name in ("TPUFT_RUN_DIR", "TPUFT_RUN_ID", "TPUFT_WORKER_ID", "TPUFT_NUM_WORKERS"):
        env.pop(name, None)  # one process, not a worker of a run
    argv = [
        python,
        *WORKER_MODULE,
        "--local",
        "--job",
        f"{job.shards}/{JOB_FILE}",
        "--processes",
        str(processes),
    ]
    started = time.monotonic()
    tail: list[str] = []
    lock = threading.Lock()

    def follow(index: int, child: subprocess.Popen[str]) -> None:
        nonlocal tail
        assert child.stdout is not None
        for raw in child.stdout:
            line = raw.rstrip("\n") if processes == 1 else f"[p{index}] {raw.rstrip()}"
            with lock:
                tail = (tail + [line])[-15:]
                if on_line is not None:
                    on_line(line)

    with ProgressWatch(job, progress, every=1.0):
        children = [
            subprocess.Popen(
                [*argv, "--process", str(index)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            )
            for index in range(processes)
        ]
        readers = [
            threading.Thread(target=follow, args=(index, child), daemon=True)
            for index, child in enumerate(children)
        ]
        for reader in readers:
            reader.start()
        code = _wait_all(children)
        for reader in readers:
            reader.join(timeout=10)
    if code != 0:
        lines = "\n".join("  " + line for line in tail)
        raise TpuftError(
            f"predicting on this machine failed (exit code {code}):\n{lines}",
            hint="The finished shards are kept: run the same command with --resume",
        )
    summary = join_output(job, output)
    seconds = time.monotonic() - started
    return PredictResult(
        output,
        int(summary.get("rows", job.total_lines or 0)),
        seconds,
        dict(summary.get("scores") or {}),
        shards=job.shards,
        resumed_shards=resumed,
    )


def _wait_all(children: list[subprocess.Popen[str]]) -> int:
    """The first non-zero exit code (the others are stopped then: a lock-step partner would wait for it), else
    0."""
    while True:
        codes = [child.poll() for child in children]
        failed = next((code for code in codes if code not in (None, 0)), None)
        if failed is not None:
            for child in children:
                if child.poll() is None:
                    child.terminate()
            for child in children:
                child.wait()
            return failed
        if all(code == 0 for code in codes):
            return 0
        time.sleep(0.2)


def score_line(scores: dict[str, Any]) -> str:
    """``exact_match 0.964, bleu 97.1 (500 examples with a target)``."""
    if not scores:
        return ""
    shown = [f"{name} {value:g}" for name, value in scores.items() if name != "examples"]
    return ", ".join(shown) + f" ({scores.get('examples', 0)} examples with a target)"


def summary_line(result: PredictResult) -> str:
    return (
        f"{result.rows:,} rows in {result.seconds:.1f} s ({result.examples_per_s:,.1f} examples/s) -> "
        f"{result.output}"
    )
