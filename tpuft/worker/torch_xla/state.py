"""The PyTorch/XLA trainer's state: the model (with the soft prompt when prompt tuning, its frozen parts, its
FSDP shards) and the optimizer with its LR scheduler, built at set-up or restored from a checkpoint, and
written into one.

Apart from :mod:`tpuft.worker.torch_xla.train` because it is what a checkpoint holds, read and written in one
place (what :func:`write_checkpoint` writes is what :func:`build_model` and :func:`build_optimizer` read
back); the trainer keeps the control flow: the order of set-up and the loop's hooks. Each function takes the
trainer and sets the attributes its docstring names, as the trainer's own set-up did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpuft.worker.schedule import lr_factor
from tpuft.worker.torch_xla.replicas import to_cpu

OPTIMIZER_STATE = "optimizer.pt"
PROMPT_FILE = "prompt.safetensors"
"""Prompt tuning: the learned prompt, in each checkpoint and beside the Hugging Face export (``export/``)."""


def build_model(trainer: Any) -> None:
    """The model on the device: loaded (or built from ``model.config``) with identical weights on every
    replica, its embedding tables tied again if they were, then the soft prompt (prompt tuning: the model
    frozen), or ``model.freeze``; under FSDP its parameters sharded. Sets ``model``, ``prompt``,
    ``named_params`` and ``params`` (the trained ones), and ``shard_specs`` under FSDP."""
    from tpuft.worker.torch_xla import parts as torch_parts

    model_cfg = trainer.recipe.model
    trainer.torch.manual_seed(trainer.recipe.train.seed)  # identical initial weights on every replica
    model = torch_parts.load_model(model_cfg, trainer.tokenizer, trainer.checkpoint)
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    trainer.model = model.to(trainer.device)
    if tied:  # moving to an XLA device un-shares the embedding tables; share them again (only if they were:
        trainer.model.tie_weights()  # a T5 v1.1 / mT5 checkpoint's own output layer must survive)
    trainer.prompt = None  # a torch_parts.SoftPrompt when prompt tuning
    tuning = model_cfg.prompt_tuning
    if tuning is not None:  # the whole model is frozen; only the prompt learns
        trainer.model.requires_grad_(False)
        trainer.prompt = torch_parts.SoftPrompt(
            trainer.model.get_input_embeddings(), tuning.tokens, tuning.init, trainer.recipe.train.seed
        )
        if trainer.checkpoint is not None:
            from safetensors.torch import load_file

            trainer.prompt.weight.data.copy_(load_file(str(trainer.checkpoint / PROMPT_FILE))["prompt"])
        trainer.prompt.to(trainer.device)
        trainer.named_params = [("prompt.weight", trainer.prompt.weight)]
    else:
        frozen = torch_parts.freeze(trainer.model, model_cfg.freeze)
        if frozen:
            trainer._say(f"frozen: {', '.join(model_cfg.freeze)} ({len(frozen)} tensors)")
        trainer.named_params = [(n, p) for n, p in trainer.model.named_parameters() if p.requires_grad]
    if trainer.fsdp:
        from tpuft.worker.torch_xla.sharding import shard_parameters

        named = list(trainer.model.named_parameters()) + (
            [("prompt.weight", trainer.prompt.weight)] if trainer.prompt is not None else []
        )
        trainer.shard_specs = shard_parameters(trainer.mesh, named)
        trainer._say(
            f"fsdp: {len(trainer.shard_specs)} parameter tensors sharded over a mesh of "
            f"{trainer.mesh.size()} devices"
        )
    trainer.params = [p for _, p in trainer.named_params]
    count = sum(p.numel() for p in trainer.model.parameters())
    trainable = sum(p.numel() for p in trainer.params)
    origin = trainer.checkpoint or ("random init" if model_cfg.config is not None else model_cfg.name_or_path)
    trainer._say(f"model: {count / 1e6:.2f}M parameters, {trainable / 1e6:.3f}M trained ({origin})")


def build_optimizer(trainer: Any) -> None:
    """The optimizer and its LR scheduler over the trained parameters, their state restored from the
    checkpoint (and sharded like its parameter under FSDP). Sets ``optimizer`` and ``scheduler``."""
    from tpuft.worker.torch_xla import parts as torch_parts

    torch = trainer.torch
    train = trainer.recipe.train
    groups = torch_parts.parameter_groups(trainer.named_params, train.weight_decay)
    trainer.optimizer = torch_parts.make_optimizer(train, groups)
    trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(
        trainer.optimizer, lr_factor(train.steps, train.warmup_steps, train.schedule)
    )
    if trainer.checkpoint is not None:
        saved = torch.load(trainer.checkpoint / OPTIMIZER_STATE, map_location="cpu", weights_only=True)
        trainer.optimizer.load_state_dict(saved["optimizer"])  # moves the state onto the parameters' device
        trainer.scheduler.load_state_dict(saved["scheduler"])
        if trainer.fsdp:  # loaded state is replicated: shard it like its parameter
            from tpuft.worker.torch_xla.sharding import shard_optimizer_state

            shard_optimizer_state(trainer.mesh, trainer.optimizer, trainer.params, trainer.shard_specs)


def cpu_state(model: Any) -> dict[str, Any]:
    """The model's weights, on the host."""
    return {k: v.detach().to("cpu") for k, v in model.state_dict().items()}


def write_checkpoint(trainer: Any, folder: Path) -> None:
    """One checkpoint: the HF weights and tokenizer, the soft prompt (prompt tuning), and the optimizer and
    scheduler state, as :func:`build_model` and :func:`build_optimizer` read them back."""
    trainer.model.save_pretrained(folder, state_dict=cpu_state(trainer.model), safe_serialization=True)
    trainer.tokenizer.save_pretrained(folder)
    if trainer.prompt is not None:
        from safetensors.torch import save_file

        save_file(
            {"prompt": trainer.prompt.weight.detach().to("cpu").contiguous()}, str(folder / PROMPT_FILE)
        )
    optimizer_state = to_cpu(trainer.torch, trainer.optimizer.state_dict())
    trainer.torch.save(
        {"optimizer": optimizer_state, "scheduler": trainer.scheduler.state_dict()}, folder / OPTIMIZER_STATE
    )
