"""``tpuft predict`` on the cluster: the job as a run of its own, under the workers' supervisors.

It is launched as ``train`` launches a trainer (the same claim, doctor's checks, supervisors, coordinator and
worker ids; :mod:`tpuft.ops.train`), with ``python -m tpuft.worker.predict.main`` as the supervised program
and the job in its environment (``TPUFT_PREDICT_JOB``). So ``attach``, ``stop``, ``logs`` and ``runs`` work on
it as on a training run; its run.json says ``"job": "predict"`` and keeps the job's settings (``predict``).

The shards go beside OUT (``OUT.shards``) when the workers can write there (a ``gs://`` OUT, or a local pod,
whose workers share this disk), else into the run storage (:func:`tpuft.ops.predict_shards.storage_shards`).
Worker 0 joins them into OUT (streamed, one shard in memory at a time) when the workers can write OUT, so a
``--detach``ed job ends with OUT written and nobody attached; OUT on this machine that remote workers cannot
reach is joined by the controller, here or in the ``attach`` that follows a ``--detach``."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpuft.config import ClusterConfig
from tpuft.core.errors import Interrupted, TpuftError, UsageError, WorkerFailure
from tpuft.fleet.base import LineSink
from tpuft.ops.common import open_session
from tpuft.ops.lifecycle import (
    AttachOutcome,
    Launch,
    attach,
    deferred_interrupts,
    finalize,
    start_supervisors,
    stop,
    wait_for_outcome,
)
from tpuft.ops.predict import WORKER_MODULE, PredictOptions, PredictResult, Source, make_job
from tpuft.ops.predict_shards import (
    Progress,
    ProgressWatch,
    absolute,
    claim_output,
    default_shards,
    join_output,
    storage_shards,
)
from tpuft.ops.setup import launch_plan
from tpuft.ops.ship_data import remote_fleet
from tpuft.ops.train import Notice, _addresses, _prepare_workers, _write_info
from tpuft.ops.trainer_env import trainer_env
from tpuft.readers.runs import Run, resolve_run
from tpuft.run import rundir
from tpuft.run.predict_job import JOB_ENV, JOB_FILE, PredictJob
from tpuft.storage import open_storage

SHIPPED_INPUTS = ".tpuft/data/predict"
"""Under a remote worker's HOME: inputs copied from this machine, named by their content (a resume finds its
copy)."""


def predict_on_cluster(
    config: ClusterConfig,
    source: Source,
    options: PredictOptions,
    total: int,
    *,
    command: str,
    on_line: LineSink | None = None,
    on_progress: Progress | None = None,
    on_start: Callable[[str, str], None] | None = None,
    on_notice: Notice | None = None,
    detach: bool = False,
    stop_on_interrupt: bool = False,
) -> PredictResult:
    """Launch the job on the backend's launch-plan workers, then (unless ``detach``) attach, show the progress
    and join the shards into OUT. ``command``: the command line that started it (a failure's hint adds
    ``--resume``)."""
    session = open_session(config)
    plan = launch_plan(session, source.recipe)
    remote = remote_fleet(session)
    output = absolute(options.output)
    if remote and not source.model.startswith("gs://"):
        raise UsageError(
            f"{source.model} is on this machine, which the workers cannot read",
            hint="Put the model in the bucket (gs://...), or predict here: --local",
        )
    shards = (
        storage_shards(session.cluster.bucket, output)
        if remote and not output.startswith("gs://")
        else default_shards(output)
    )
    input_url = absolute(options.input)
    shipped = remote and not input_url.startswith("gs://")
    if shipped:
        input_url = f"{SHIPPED_INPUTS}/{_content_key(Path(input_url))}-{Path(input_url).name}"
    # Worker 0 joins into OUT when the workers can write it (a gs:// OUT, or a local pod on this disk), so
    # that a detached job ends with OUT written; OUT on this machine, which remote workers cannot reach, is
    # joined here.
    by_workers = output.startswith("gs://") or not remote
    job = make_job(
        source,
        options,
        model=source.model,
        backend=source.backend,
        input_url=input_url,
        shards=shards,
        output=output if by_workers else None,
        total=total,
    )
    # a busy cluster is refused before OUT is touched
    launch = _prepare_workers(session, source.recipe, plan, on_notice)
    resumed = claim_output(
        job, output, resume=options.resume, overwrite=options.overwrite, project=config.gcp.project
    )
    if shipped:
        session.fleet.put(Path(absolute(options.input)), input_url, workers=plan.workers)

    run_id = rundir.new_run_id(f"predict-{source.recipe.name}")
    run = Run(run_id, str(open_storage(session.cluster.bucket).run_dir(run_id)), config.gcp.project)
    run.storage.write_text(rundir.RECIPE, source.recipe_text)
    started = time.time()
    info: dict[str, Any] = {
        "run_id": run_id,
        "job": "predict",
        "recipe": source.recipe.name,
        "backend": source.recipe.backend.kind,
        "cluster": config.name,
        "provider": config.provider,
        "accelerator": config.accelerator,
        "workers": len(plan.workers),
        "hosts": len(session.cluster.workers),
        "total_steps": total,
        "started": started,
        "status": "running",
        "attempt": 1,
        "attempts": [{"attempt": 1, "started": started}],
        "launch": launch.as_json(),
        "addresses": _addresses(session, plan),
        "predict": {
            "source": source.label,
            "model": source.model,
            "engine": source.backend,
            "input": options.input,
            "output": output,
            "shards": shards,
            "examples": total,
            "resumed_shards": resumed,
            "command": command,
        },
    }
    _write_info(run, info)
    if on_start is not None:
        on_start(run_id, run.url)
    env = {**trainer_env(session, config, plan, resume=False), JOB_ENV: job.to_json()}
    try:
        with deferred_interrupts() as deferred:
            start_supervisors(
                session,
                run,
                launch,
                env,
                attempt=1,
                hang_timeout=source.recipe.train.hang_timeout,
                argv=(launch.python, *WORKER_MODULE),
                free_tpu=session.shape.target == "tpu",
            )
    except BaseException as exc:
        cause = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        if finalize(run) is None:
            _write_info(run, run.info() or info, status="failed", ended=time.time(), cause=cause[:2000])
        raise
    if detach:
        return PredictResult(
            output, 0, 0.0, run_id=run_id, shards=shards, resumed_shards=resumed, detached=True
        )
    if deferred.fired:
        outcome = AttachOutcome(ended=False, interrupted=True, hung_up=deferred.hung_up)
    else:
        with ProgressWatch(job, on_progress, config.gcp.project):
            outcome = attach(session, run, launch, on_line)
    return _after_attach(config, run, outcome, stop_on_interrupt)


def attach_predict(
    config: ClusterConfig,
    run: Run,
    *,
    on_line: LineSink | None = None,
    on_progress: Progress | None = None,
    tail: int | None = None,
    since: str | None = None,
    stop_on_interrupt: bool = False,
) -> PredictResult:
    """``tpuft attach`` of a predict run: its lines and progress until it ends, then the join (which a
    ``--detach`` left to this)."""
    info = finalize(run) or run.info()
    if info.get("status") == "running":
        session = open_session(config)
        with ProgressWatch(job_of(run, info, config), on_progress, config.gcp.project):
            outcome = attach(session, run, Launch.of(run, info), on_line, tail=tail, since=since)
        return _after_attach(config, run, outcome, stop_on_interrupt)
    return finish(config, run, info)


def is_predict_run(config: ClusterConfig, run_id: str | None) -> Run | None:
    run = resolve_run(config, run_id)
    return run if run.info().get("job") == "predict" else None


def job_of(run: Run, info: dict[str, Any], config: ClusterConfig) -> PredictJob:
    shards = str((info.get("predict") or {}).get("shards") or "")
    text = open_storage(shards, project=config.gcp.project).read_text(JOB_FILE) if shards else None
    if text is None:
        raise TpuftError(f"predict run {run.id}: its job ({shards}/{JOB_FILE}) is gone")
    return PredictJob.from_json(text)


def _after_attach(
    config: ClusterConfig, run: Run, outcome: AttachOutcome, stop_on_interrupt: bool
) -> PredictResult:
    info = run.info()
    spec = info.get("predict") or {}
    if outcome.interrupted:
        if stop_on_interrupt and not outcome.hung_up:
            stopped = stop(config, run, reason="interrupted on the controller (Ctrl-C)")
            raise Interrupted(
                f"stopped predict run {run.id} ({stopped.status}); its finished shards are kept",
                hint=f"Continue it: {spec.get('command', 'tpuft predict ...')} --resume",
            )
        return PredictResult(
            str(spec.get("output")), 0, 0.0, run_id=run.id, shards=str(spec.get("shards")), detached=True
        )
    if outcome.lost:
        raise TpuftError(
            f"lost contact with worker(s) {', '.join(map(str, outcome.lost))} of predict run {run.id}; "
            "their supervisors may still be predicting",
            hint=f"Re-attach: tpuft attach {run.id}",
        )
    return finish(config, run, wait_for_outcome(run))


def finish(config: ClusterConfig, run: Run, info: dict[str, Any]) -> PredictResult:
    """A predict run that has ended: the join into OUT and the scores, or the error that says how it ended."""
    spec = info.get("predict") or {}
    again = f"{spec.get('command', 'tpuft predict ...')} --resume"
    status = info.get("status")
    if status == "failed":
        lines = [f"predict run {run.id} failed: {info.get('cause', 'see the logs')}"]
        culprit = info.get("culprit")
        lines += ["  " + line for line in info.get("culprit_tail") or []]
        if culprit is not None:
            lines.append(f"full log: {run.url}/{rundir.LOGS_DIR}/worker-{culprit}.log")
        raise WorkerFailure(
            "\n".join(lines), hint=f"Fix it, then predict the rest (finished shards are kept): {again}"
        )
    if status == "stopped":
        raise TpuftError(
            f"predict run {run.id} was stopped: {info.get('cause', '')}",
            hint=f"Predict the rest (finished shards are kept): {again}",
        )
    if status != "finished":
        raise TpuftError(
            f"predict run {run.id} has no outcome yet ({status})", hint=f"Look: tpuft monitor {run.id}"
        )
    job = job_of(run, info, config)
    from tpuft.run.predict_parts import joined

    # worker 0 joined, or here
    summary = (joined(job) if job.output else None) or join_output(job, str(spec["output"]))
    seconds = float(info.get("seconds") or (time.time() - float(info.get("started") or time.time())))
    return PredictResult(
        str(spec["output"]),
        int(summary.get("rows") or 0),
        seconds,
        dict(summary.get("scores") or {}),
        run_id=run.id,
        shards=job.shards,
        resumed_shards=int(spec.get("resumed_shards") or 0),
    )


def _content_key(path: Path) -> str:
    """The input's content hash (16 hex digits), streamed: a changed input is another job, the same one
    resumes."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]
