"""``python -m tpuft.worker``: load the resolved recipe from the run dir and hand over to the backend's trainer."""

from __future__ import annotations

import importlib
import sys
import traceback

from tpuft import rundir
from tpuft.config import recipe_from_text
from tpuft.worker.context import WorkerContext, pin_cpus


def main() -> int:
    ctx = WorkerContext.from_env()
    pin_cpus()
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


if __name__ == "__main__":
    sys.exit(main())
