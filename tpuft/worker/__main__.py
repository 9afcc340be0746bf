"""``python -m tpuft.worker``: load the resolved recipe from the run dir and hand over to the backend's
trainer.

It runs under the worker's supervisor (tpuft/worker/supervisor/process.py). When the run dir is remote
(gs://), objects cannot be appended to: the supervisor has put the recipe in a local staging folder
(``ctx.run_dir``), where the trainer writes, and mirrors that folder to the bucket while it grows and once
more at the end. A backend whose trainer writes the bucket itself (T5X's checkpoints do) also gets the gs://
URL (``ctx.run_url``).
"""

from __future__ import annotations

import importlib
import sys
import traceback

from tpuft.config import recipe_from_text
from tpuft.core.errors import TpuftError
from tpuft.data import DataError
from tpuft.run import rundir
from tpuft.worker.context import WorkerContext, pin_cpus
from tpuft.worker.multislice import apply_megascale_env


def _recipe_text(ctx: WorkerContext) -> str:
    path = ctx.run_dir / rundir.RECIPE
    if not path.is_file():
        raise SystemExit(f"tpuft.worker: {path} not found (a gs:// run is staged by the worker's supervisor)")
    return path.read_text(encoding="utf-8")


def _record_failure(ctx: WorkerContext, error: str) -> None:
    rundir.write_json_atomic(
        rundir.heartbeat_path(ctx.run_dir, ctx.worker_id),
        {"worker": ctx.worker_id, "status": "failed", "error": error},
    )


def main() -> int:
    ctx = WorkerContext.from_env()
    pin_cpus()
    try:
        recipe = recipe_from_text(_recipe_text(ctx), f"{ctx.run_url}/{rundir.RECIPE}")
        # Before the backend's import: the runtime reads them as it loads.
        multislice = apply_megascale_env(ctx, startup_timeout=recipe.train.startup_timeout)
        if multislice:
            print(f"[tpuft] {multislice}", flush=True)
        trainer = importlib.import_module(f"tpuft.worker.{recipe.backend.kind}.train")
        return int(trainer.main(ctx, recipe) or 0)
    except (DataError, TpuftError) as exc:  # the user's data or recipe: one located line, no traceback
        print(f"[tpuft] error on {ctx.layout.name(ctx.worker_id)}: {exc}", flush=True)
        _record_failure(ctx, str(exc))
        return 2
    except Exception:  # noqa: BLE001 - the trainer's last word: recorded, then the exit code
        traceback.print_exc()
        _record_failure(ctx, traceback.format_exc(limit=3)[-2000:])
        return 1


if __name__ == "__main__":
    sys.exit(main())
