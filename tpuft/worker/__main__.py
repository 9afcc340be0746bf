"""``python -m tpuft.worker``: load the resolved recipe from the run dir and hand over to the backend's trainer.

When the run dir is remote (gs://), the worker fetches the recipe into a local staging folder, trains there, and a
background thread mirrors what it writes back to the bucket (tpuft/worker/sync.py), once more at the very end.
"""

from __future__ import annotations

import importlib
import sys
import traceback

from tpuft import rundir
from tpuft.config import recipe_from_text
from tpuft.worker.context import WorkerContext, pin_cpus


def _stage(ctx: WorkerContext):  # type: ignore[no-untyped-def]
    """For a gs:// run dir: fetch the recipe into local staging and start mirroring back. Returns the syncer."""
    from tpuft.storage import open_storage
    from tpuft.worker.sync import RunDirSync

    storage = open_storage(ctx.run_url)
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    text = storage.read_text(rundir.RECIPE)
    if text is None:
        raise SystemExit(f"tpuft.worker: {ctx.run_url}/{rundir.RECIPE} not found")
    (ctx.run_dir / rundir.RECIPE).write_text(text)
    syncer = RunDirSync(ctx.run_dir, storage)
    syncer.changed_files()  # the recipe came from there: do not send it back
    return syncer.start()


def main() -> int:
    ctx = WorkerContext.from_env()
    pin_cpus()
    syncer = _stage(ctx) if ctx.remote else None
    try:
        recipe_path = ctx.run_dir / rundir.RECIPE
        recipe = recipe_from_text(recipe_path.read_text(encoding="utf-8"), str(recipe_path))
        trainer = importlib.import_module(f"tpuft.worker.{recipe.backend.kind}_train")
        try:
            return int(trainer.main(ctx, recipe) or 0)
        except Exception:
            traceback.print_exc()
            rundir.write_json_atomic(
                rundir.heartbeat_path(ctx.run_dir, ctx.worker_id),
                {"worker": ctx.worker_id, "status": "failed", "error": traceback.format_exc(limit=3)[-2000:]},
            )
            return 1
    finally:
        if syncer is not None:
            syncer.close()


if __name__ == "__main__":
    sys.exit(main())
