"""``python -m tpuft.worker``: load the resolved recipe from the run dir and hand over to the backend's trainer.

When the run dir is remote (gs://) and the backend's layout says its trainer writes locally (objects cannot be
appended to), the worker trains in a local staging folder and a background thread mirrors what it writes back to the
bucket (tpuft/storage/sync.py), once more at the very end. A backend whose trainer writes the bucket itself (T5X's
checkpoints do) gets the gs:// run dir as it is.
"""

from __future__ import annotations

import importlib
import sys
import traceback

from tpuft import rundir
from tpuft.backends import get_backend
from tpuft.config import recipe_from_text
from tpuft.errors import TpuftError
from tpuft.worker.context import WorkerContext, pin_cpus
from tpuft.worker.data import DataError


def _recipe_text(ctx: WorkerContext) -> str:
    if not ctx.remote:
        return (ctx.run_dir / rundir.RECIPE).read_text(encoding="utf-8")
    from tpuft.storage import open_storage

    text = open_storage(ctx.run_url).read_text(rundir.RECIPE)
    if text is None:
        raise SystemExit(f"tpuft.worker: {ctx.run_url}/{rundir.RECIPE} not found")
    return text


def _stage(ctx: WorkerContext, recipe_text: str):  # type: ignore[no-untyped-def]
    """Train in a local folder and mirror it to the gs:// run dir; returns the running syncer."""
    from tpuft.storage import open_storage
    from tpuft.storage.sync import RunDirSync

    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    (ctx.run_dir / rundir.RECIPE).write_text(recipe_text)
    syncer = RunDirSync(ctx.run_dir, open_storage(ctx.run_url))
    syncer.changed_files()  # the recipe came from there: do not send it back
    return syncer.start()


def _record_failure(ctx: WorkerContext, error: str) -> None:
    rundir.write_json_atomic(
        rundir.heartbeat_path(ctx.run_dir, ctx.worker_id), {"worker": ctx.worker_id, "status": "failed", "error": error}
    )


def main() -> int:
    ctx = WorkerContext.from_env()
    pin_cpus()
    syncer = None
    try:
        try:
            text = _recipe_text(ctx)
            recipe = recipe_from_text(text, f"{ctx.run_url}/{rundir.RECIPE}")
            if ctx.remote and not get_backend(recipe.backend.kind).layout.writes_to_bucket:
                syncer = _stage(ctx, text)
            trainer = importlib.import_module(f"tpuft.worker.{recipe.backend.kind}_train")
            return int(trainer.main(ctx, recipe) or 0)
        except (DataError, TpuftError) as exc:  # the user's data or recipe: one located line, no traceback
            print(f"[tpuft] error on worker {ctx.worker_id}: {exc}", flush=True)
            _record_failure(ctx, str(exc))
            return 2
        except Exception:
            traceback.print_exc()
            _record_failure(ctx, traceback.format_exc(limit=3)[-2000:])
            return 1
    finally:
        if syncer is not None:
            syncer.close()


if __name__ == "__main__":
    sys.exit(main())
