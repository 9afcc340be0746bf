"""``python -m tpuft.worker``: load the resolved recipe from the run dir and hand over to the backend's trainer.

When the run dir is remote (gs://), the worker fetches the recipe into a local staging folder, trains there, and a
background thread mirrors what it writes back to the bucket (tpuft/storage/sync.py), once more at the very end.
"""

from __future__ import annotations

import importlib
import sys
import traceback

from tpuft import rundir
from tpuft.config import recipe_from_text
from tpuft.errors import TpuftError
from tpuft.worker.data import DataError
from tpuft.worker.context import WorkerContext, pin_cpus


def _stage(ctx: WorkerContext):  # type: ignore[no-untyped-def]
    """For a gs:// run dir: fetch the recipe into local staging and start mirroring back. Returns the syncer."""
    from tpuft.storage import open_storage
    from tpuft.storage.sync import RunDirSync

    storage = open_storage(ctx.run_url)
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    text = storage.read_text(rundir.RECIPE)
    if text is None:
        raise SystemExit(f"tpuft.worker: {ctx.run_url}/{rundir.RECIPE} not found")
    (ctx.run_dir / rundir.RECIPE).write_text(text)
    syncer = RunDirSync(ctx.run_dir, storage)
    syncer.changed_files()  # the recipe came from there: do not send it back
    return syncer.start()


def _record_failure(ctx: WorkerContext, error: str) -> None:
    rundir.write_json_atomic(
        rundir.heartbeat_path(ctx.run_dir, ctx.worker_id), {"worker": ctx.worker_id, "status": "failed", "error": error}
    )


def main() -> int:
    ctx = WorkerContext.from_env()
    pin_cpus()
    syncer = _stage(ctx) if ctx.remote else None
    try:
        try:
            recipe_path = ctx.run_dir / rundir.RECIPE
            recipe = recipe_from_text(recipe_path.read_text(encoding="utf-8"), str(recipe_path))
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
