"""The PyTorch/XLA trainer's test evaluation (``data.test`` or ``data.hf.test_split``), once at the end of a
run (:func:`tpuft.worker.loop.finish` calls the trainer's ``test`` hook before the final checkpoint).

Every replica greedy-decodes its share of the test set on the device, with the trainer's own static-shape
decoder (the one eval's BLEU uses, soft prompt included), scores its decodes with
:mod:`tpuft.scoring.predictions` (the code ``tpuft predict`` scores with too) and sums the statistics over the
replicas with the trainer's collective; it writes its predictions to ``test/predictions-<replica>.jsonl``. On
the best checkpoint (``train.keep_best``) the weights are swapped in from the checkpoint's files and the
trained ones put back afterwards, tensor by tensor in place: the final checkpoint, the weight digest and the
export see the weights the run ended with, and a parameter keeps its device sharding (FSDP).

Not supported: FSDP over several TPU hosts (one SPMD program whose batch spans hosts: a host cannot read back
its own rows of the decodes, and its host-side sums are not summed across hosts);
:mod:`tpuft.backends.torch_xla` refuses a test set there before launch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tpuft.data import Example
from tpuft.scoring import predictions
from tpuft.worker.torch_xla import heldout

SAFETENSORS_INDEX = "model.safetensors.index.json"


def run_test(
    trainer: Any, shard: list[tuple[int, Example]], checkpoint: Path | None, prompt_file: str
) -> dict[str, Any]:
    """:meth:`tpuft.worker.loop.TrainerHooks.test` for ``trainer`` (a
    :class:`~tpuft.worker.torch_xla.train.Trainer`): ``shard`` is this replica's ``(id, example)`` share;
    ``prompt_file`` the soft prompt's name in a checkpoint."""
    torch = trainer.torch
    trained = trainer._trained_state() if checkpoint is not None else None
    try:
        if checkpoint is not None:
            put_weights(
                trainer.model,
                trainer.prompt,
                checkpoint_state(checkpoint, prompt_file if trainer.prompt is not None else None),
            )
        trainer.model.eval()
        with torch.no_grad():
            decoded = heldout.decode(trainer, [example for _, example in shard])
    finally:
        if trained is not None:
            put_weights(trainer.model, trainer.prompt, trained)
        trainer.model.train()
    write_share(
        trainer.loop.test_predictions_dir(), trainer.replicas.rank, trainer.replicas.world, shard, decoded
    )
    local = predictions.statistics(decoded, [example.target for _, example in shard])
    summed = trainer.replicas.sum(torch.tensor(local, dtype=torch.float64).to(trainer.device))
    return predictions.scores([float(x) for x in summed.to("cpu").tolist()])


def write_share(
    folder: Path, rank: int, world: int, shard: list[tuple[int, Example]], decoded: list[str]
) -> None:
    """This replica's predictions file. The first replica also removes the files of replicas this run does not
    have (an earlier attempt on more replicas), which no other replica writes."""
    if rank == 0 and folder.is_dir():
        for stale in folder.glob("predictions-*.jsonl"):
            if stale.name not in {predictions.shard_name(index) for index in range(world)}:
                stale.unlink(missing_ok=True)
    rows = (
        predictions.row(index, example.source, text, example.target)
        for (index, example), text in zip(shard, decoded)
    )
    predictions.write_predictions(folder / predictions.shard_name(rank), rows)


def checkpoint_state(folder: Path, prompt_file: str | None) -> dict[str, Any]:
    """A checkpoint's weights on the host, by parameter name (its ``model.safetensors``, or every file its
    index names), and with ``prompt_file`` the soft prompt as ``prompt.weight`` (the name the trainer's state
    gives it)."""
    from safetensors.torch import load_file

    index = folder / SAFETENSORS_INDEX
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values()))
        if index.exists()
        else ["model.safetensors"]
    )
    state: dict[str, Any] = {}
    for name in files:
        state.update(load_file(str(folder / name)))
    if prompt_file is not None:
        state["prompt.weight"] = load_file(str(folder / prompt_file))["prompt"]
    return state


def put_weights(model: Any, prompt: Any, state: dict[str, Any]) -> None:
    """Copy ``state`` (host tensors by name) into the model's parameters in place (they keep their device and
    sharding). A checkpoint leaves out tied copies (``lm_head.weight`` of a tied embedding): a name it lacks
    must be the same tensor as one it has."""
    import torch

    state = dict(state)
    vectors = state.pop("prompt.weight", None)
    with torch.no_grad():
        if prompt is not None and vectors is not None:
            prompt.weight.copy_(vectors)
        missing, unexpected = model.load_state_dict(state, strict=False)
    tensors = model.state_dict(keep_vars=True)
    filled = {id(tensors[name]) for name in state if name in tensors}
    untouched = [name for name in missing if id(tensors[name]) not in filled]
    if untouched or unexpected:
        raise RuntimeError(
            f"the checkpoint's weights do not match the model: missing {untouched[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
