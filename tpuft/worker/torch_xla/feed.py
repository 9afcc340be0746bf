"""Feeding the PyTorch/XLA trainer: this replica's training stream (continued from the checkpoint's data
position), its shares of the eval and test sets, and the per-replica batch sizes.

Apart from :mod:`tpuft.worker.torch_xla.train` because it is the trainer's one meeting with the data
(:mod:`tpuft.worker.hf_data`: JSON lines or a Hugging Face dataset) and its rules for splitting the global
batch over replicas and devices; the trainer keeps the control flow and encodes each batch as it draws it.
"""

from __future__ import annotations

from typing import Any


def setup_data(trainer: Any) -> None:
    """This replica's training stream (from the checkpoint's data position), its eval and test shares and the
    examples it decodes for BLEU/ROUGE-L; the per-replica batch sizes. Sets ``batches``, ``local_batch``,
    ``local_eval_batch``, ``eval_shard``, ``generate_shard`` and ``test_shard``."""
    from tpuft.worker.hf_data import has_held_out, held_out, load_eval_examples, open_train_stream

    cfg = trainer.recipe.data
    world, rank = trainer.replicas.world, trainer.replicas.rank
    devices = trainer.local_devices  # the batch dimension is sharded over them (1 without a mesh)
    if trainer.recipe.train.batch_size % (world * devices):
        raise ValueError(
            f"train.batch_size ({trainer.recipe.train.batch_size}) must be divisible by the number of "
            f"replicas ({world} x {devices} devices)"
        )
    trainer.local_batch = trainer.recipe.train.batch_size // world
    trainer.local_eval_batch = max(1, trainer.recipe.eval.batch_size // world)
    trainer.local_eval_batch = -(-trainer.local_eval_batch // devices) * devices
    saved_world = trainer.trainer_state.get("replicas", world)
    if saved_world != world:
        trainer._say(
            f"the checkpoint was written by {saved_world} replicas and this run has {world}: the data "
            "is sharded differently, so this run goes on from the checkpoint but not exactly as the original "
            "would have"
        )
    position = trainer.trainer_state.get("data_position") if trainer.checkpoint is not None else None
    if (
        trainer.checkpoint is not None and position is None
    ):  # a checkpoint from before data positions were saved
        position = {"consumed": trainer.start_step * trainer.local_batch}
    trainer.batches = open_train_stream(
        cfg,
        rank=rank,
        world=world,
        local_batch=trainer.local_batch,
        seed=trainer.recipe.train.seed,
        position=position,
    )
    trainer.test_shard = held_out(cfg, "test", rank=rank, world=world) if has_held_out(cfg, "test") else None
    trainer.eval_shard = None
    trainer.generate_shard = []
    if has_held_out(cfg, "eval"):
        trainer.eval_shard = load_eval_examples(
            cfg, rank=rank, world=world, limit=trainer.recipe.eval.max_examples
        )
        wanted = trainer.recipe.eval.generate_examples  # the first ones of the set, wherever their shard is
        trainer.generate_shard = trainer.eval_shard[: len(range(rank, wanted, world))]
    split = f" over {devices} devices" if devices > 1 else ""
    accum = trainer.recipe.train.grad_accum_steps
    micro = f", {accum} micro-batches a step" if accum > 1 else ""
    trainer._say(
        f"data: {getattr(trainer.batches, 'examples', 'streamed')} train "
        f"/ {len(trainer.eval_shard or [])} eval / {len(trainer.test_shard or [])} test examples on "
        f"replica {rank} (batch {trainer.local_batch} "
        f"per replica{split}, {trainer.recipe.train.batch_size} global{micro})",
        everyone=True,
    )
