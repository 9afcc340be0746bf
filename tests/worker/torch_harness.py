"""Runs the PyTorch/XLA trainer in this process (one replica, PJRT CPU) and reports what the feature tests
check.

Executed in the backend's venv by ``tests/worker/test_torch_features.py``: ``python torch_harness.py
CONFIG.json`` prints one JSON line. CONFIG: {"recipe": path, "set": [overrides], "run_dir": path, "probe":
[what to report]}. ``python torch_harness.py --serve`` takes CONFIG paths on stdin, one per line, runs each in
this one process (the imports and XLA's in-memory compilations are paid once for the module's tests), writes
the JSON to CONFIG's "result" path and prints ``DONE PATH``. A CONFIG {"compare": [a, b], "result": path}
compares two saved states instead. The trainer is the real one (``Trainer.setup/train/finish``); the harness
only looks at it between the phases: the weights before training, the gradients each optimizer step received,
logits under autocast, decodes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

DONE = "__TPUFT_HARNESS_DONE__"


def main() -> None:
    if sys.argv[1:] == ["--serve"]:
        serve()
        return
    print(json.dumps(harness(json.loads(Path(sys.argv[1]).read_text()))))


def serve() -> None:
    import traceback

    for line in sys.stdin:
        cfg = json.loads(Path(line.strip()).read_text())
        try:
            out = compare(*cfg["compare"]) if "compare" in cfg else harness(cfg)
        except BaseException:  # noqa: BLE001 - reported to the test, which fails with it
            out = {"error": traceback.format_exc()}
        Path(cfg["result"]).write_text(json.dumps(out))
        print(f"{DONE} {cfg['result']}", flush=True)


def compare(a: str, b: str) -> list[dict[str, float]]:
    """Per saved state (a list of gradient dicts, or one weight dict): the largest difference between ``a``
    and ``b`` over every tensor, and the largest magnitude in ``a``."""
    import torch

    x, y = torch.load(a), torch.load(b)
    x, y = (x, y) if isinstance(x, list) else ([x], [y])
    assert len(x) == len(y) and all(p.keys() == q.keys() for p, q in zip(x, y))
    return [
        {
            "diff": max(float((p[k].double() - q[k].double()).abs().max()) for k in p),
            "scale": max(float(p[k].double().abs().max()) for k in p),
        }
        for p, q in zip(x, y)
    ]


def harness(cfg: dict) -> dict:
    run_dir = Path(cfg["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    os.environ.update(
        {
            "TPUFT_RUN_ID": run_dir.name,
            "TPUFT_RUN_DIR": str(run_dir),
            "TPUFT_WORKER_ID": "0",
            "TPUFT_NUM_WORKERS": "1",
            "PJRT_DEVICE": "CPU",
        }
    )
    import torch

    from tpuft.config import load_recipe
    from tpuft.worker.context import WorkerContext
    from tpuft.worker.torch_xla.train import Trainer

    recipe = load_recipe(Path(cfg["recipe"]), cfg.get("set", [])).value
    trainer = Trainer(WorkerContext.from_env(), recipe, tpu=False)
    probe = set(cfg.get("probe", []))
    out: dict = {}
    trainer.setup()
    before = {k: v.clone() for k, v in trainer._trained_state().items()}
    grads: list[dict[str, torch.Tensor]] = []
    if "grads" in probe:  # what each optimizer step is given (after the reduction and clipping)
        step = trainer.optimizer.step

        def recording_step(*args, **kwargs):  # type: ignore[no-untyped-def]
            trainer.torch_xla.sync()  # one graph for the gradients, not one per fetched tensor
            grads.append({n: p.grad.detach().to("cpu").clone() for n, p in trainer.named_params})
            return step(*args, **kwargs)

        trainer.optimizer.step = recording_step
    if "optimizer" in probe:
        out["optimizer"] = {
            "class": type(trainer.optimizer).__name__,
            "defaults": {
                k: (list(v) if isinstance(v, tuple) else v)
                for k, v in trainer.optimizer.defaults.items()
                if k != "params"
            },
            "groups": [
                {"weight_decay": g["weight_decay"], "size": len(g["params"])}
                for g in trainer.optimizer.param_groups
            ],
        }
        names = {id(p): n for n, p in trainer.named_params}
        out["no_decay"] = sorted(
            names[id(p)]
            for g in trainer.optimizer.param_groups
            if g["weight_decay"] == 0
            for p in g["params"]
        )
    if "sharding" in probe:  # what XLA was told of each parameter's layout over the mesh
        import torch_xla

        out["sharding"] = {
            n: torch_xla._XLAC._get_xla_sharding_spec(p) for n, p in trainer.model.named_parameters()
        }
        out["mesh_devices"] = int(trainer.mesh.size()) if trainer.mesh is not None else None
    if "logits_dtype" in probe:
        batch = trainer._encode(trainer.eval_shard[:4])
        out["logits_dtype"] = str(trainer._logits(batch).dtype)
    try:
        trainer.train()
        trainer.finish()
    finally:
        trainer.metrics.close()
        trainer.replicas.close()
    after = trainer._trained_state()
    out["changed"] = sorted(n for n in before if not torch.equal(before[n], after[n]))
    out["unchanged"] = sorted(n for n in before if torch.equal(before[n], after[n]))
    out["step"] = trainer.step
    out["stopped_early"] = trainer.stopped_early
    out["best"] = trainer.loop.best
    out["last_eval"] = trainer.loop.last_eval
    if grads:
        torch.save(grads, run_dir / "grads.pt")
        out["grads"] = str(run_dir / "grads.pt")
    torch.save(after, run_dir / "final.pt")
    out["final"] = str(run_dir / "final.pt")
    if "test" in probe:  # the test row, and which checkpoints hold the weights the run ended with in memory
        from tpuft.worker.torch_xla.testset import checkpoint_state

        out["test_result"] = trainer.loop.test_result
        out["weights_vs_checkpoints"] = {
            folder.name: all(
                torch.equal(value, after[name]) for name, value in checkpoint_state(folder, None).items()
            )
            for folder in sorted((run_dir / "checkpoints").iterdir())
        }
    if "decodes" in probe:  # the static-shape greedy decoder against transformers' generate() on the host
        from transformers import T5ForConditionalGeneration

        examples = trainer.generate_shard
        from tpuft.worker.torch_xla.heldout import decode

        ours = decode(trainer, examples)
        host = T5ForConditionalGeneration.from_pretrained(trainer.ctx.run_dir / "export" / "hf")
        enc = trainer.tokenizer([e.source for e in examples], return_tensors="pt", padding=True)
        with torch.no_grad():
            ids = host.generate(
                **enc, max_new_tokens=recipe.data.max_target_length, do_sample=False, num_beams=1
            )
        out["decodes"] = {
            "ours": ours,
            "generate": trainer.tokenizer.batch_decode(ids, skip_special_tokens=True),
            "targets": [e.target for e in examples],
        }
    return out


if __name__ == "__main__":
    main()
