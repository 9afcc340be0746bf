"""``python -m tpuft.worker.predict.main --job FILE`` (or the job's JSON in ``$TPUFT_PREDICT_JOB``): one
worker's share of a ``tpuft predict`` job, handed to the backend's engine module
``tpuft.worker.<backend>_predict``.

On the cluster it runs where the trainer would (the backend's venv, under the worker's supervisor, whose
environment gives the worker's place: ``TPUFT_WORKER_ID``, ``TPUFT_NUM_WORKERS``, ``TPUFT_RUN_DIR`` for the
heartbeat). ``--local`` runs the Hugging Face engine (``hf``) on this machine without a supervisor, as process
``--process`` of ``--processes`` (each its share of every shard, as a worker's processes): the model is then
an HF model folder (a run's export, or any).

Every engine module offers ``main(ctx, recipe, job) -> int``, which builds its engine and hands it to
:func:`tpuft.worker.predict.loop.serve`. The last line a chief prints is ``[tpuft] predict result {json}``:
the join's summary (rows, shards, output, scores), for the controller to read.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from pathlib import Path

from tpuft.config import recipe_from_text
from tpuft.core.errors import TpuftError
from tpuft.data import DataError
from tpuft.run.predict_job import JOB_ENV, PredictJob
from tpuft.worker.context import WorkerContext, pin_cpus


def load_job(path: str | None) -> PredictJob:
    if path:
        return PredictJob.from_json(Path(path).expanduser().read_text(encoding="utf-8"))
    text = os.environ.get(JOB_ENV)
    if not text:
        raise SystemExit(f"tpuft.worker.predict.main: give --job FILE or the job's JSON in ${JOB_ENV}")
    return PredictJob.from_json(text)


def local_context(job: PredictJob, process: int = 0, processes: int = 1) -> WorkerContext:
    """A process of a ``--local`` job (``process`` of ``processes``, each its share of every shard): no run
    dir (no heartbeat)."""
    return WorkerContext(
        run_id="predict-local",
        run_dir=Path(job.shards),
        worker_id=process,
        num_workers=processes,
        coordinator="127.0.0.1:0",
        run_url="",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tpuft.worker.predict.main", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--job", help="the job's JSON file (default: $TPUFT_PREDICT_JOB)")
    parser.add_argument("--local", action="store_true", help="the hf engine, no supervisor")
    parser.add_argument("--process", type=int, default=0, help="--local: this process's index")
    parser.add_argument("--processes", type=int, default=1, help="--local: how many processes share the job")
    args = parser.parse_args(argv)
    if not 0 <= args.process < args.processes:
        parser.error(f"--process {args.process} is not one of --processes {args.processes}")
    job = load_job(args.job)
    ctx = local_context(job, args.process, args.processes) if args.local else WorkerContext.from_env()
    if not args.local:
        pin_cpus()
    backend = "hf" if args.local else job.backend
    try:
        recipe = recipe_from_text(job.recipe, f"{job.shards}/recipe.yaml", check_files=False)
        engine_module = importlib.import_module(
            "tpuft.worker.predict.hf" if backend == "hf" else f"tpuft.worker.{backend}.predict"
        )
        return int(engine_module.main(ctx, recipe, job) or 0)
    except (DataError, TpuftError) as exc:  # the user's input or model: one located line, no traceback
        hint = getattr(exc, "hint", None)
        print(
            f"[tpuft] error on worker {ctx.worker_id}: {exc}" + (f"\n  hint: {hint}" if hint else ""),
            flush=True,
        )
        return 2
    except Exception:  # noqa: BLE001 - the job's last word: the traceback, then the exit code
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
