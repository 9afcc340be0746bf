"""PyTorch/XLA trainer: T5 (HF transformers) on the PJRT runtime, data-parallel across workers.

Reads top to bottom like a torchtune recipe: ``Trainer.setup()`` builds tokenizer, model, optimizer and data;
``train()`` runs the loop with periodic eval and checkpoints; ``finish()`` evaluates, saves, exports to Hugging Face
format and records each worker's weight digest (all workers must end with identical weights).

Shapes are static (inputs padded to the recipe's max lengths, the last eval batch padded with weight-0 rows), so XLA
compiles a handful of graphs once. The learning rate changes every step without recompiling: torch-xla passes
Python scalars into graphs as data.

Replication:
- local CPU pod: one PJRT CPU device per worker process; gradients (and the step's loss and token count, in the
  same buffer) are averaged with torch.distributed over gloo, worker 0 being the rendezvous.
- TPU host: one process per local chip (``torch_xla.launch``); gradients are averaged with XLA collectives
  (``xm.reduce_gradients``) across every chip of every host.

Resume (``TPUFT_RESUME=1``, set by the controller when it restarts a run): the trainer continues from the run's
latest complete checkpoint (listed in the bucket and downloaded by every worker for a ``gs://`` run) and ends with
the same weights as the run uninterrupted. A checkpoint holds the weights, the optimizer and LR scheduler state, and
in ``trainer_state.json`` the step and the elapsed training time. The rest is derived: each replica's place in its
data stream is step x local batch (``data.batches(consumed=...)``), and every replica reseeds python's ``random``,
torch's CPU generator and the XLA device RNG from (seed, replica, step) at the start and after every checkpoint
step, so an uninterrupted run and a resumed one draw the same dropout masks on every replica without any replica's
RNG state being saved. ``metrics.jsonl`` and TensorBoard forget what was logged after the checkpoint.

Heartbeats: every step, with the phase the trainer is in (``starting`` until its first step is done, ``collective``
before the gradient all-reduce, ``step``, ``eval``, ``checkpoint``, ``export``) for the worker's supervisor.

Eval exact match is computed with teacher forcing: a target counts as matched when the argmax at every target
position equals the reference token (EOS included), which is exactly when greedy decoding would produce the
reference, and it needs no dynamic-shape generation on the device.

Raises:
    DataError: a data file line is not JSON or lacks the configured field.
    ValueError: the global batch does not split evenly over the replicas.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuft import rundir
from tpuft.backends.torch_xla import LAYOUT
from tpuft.config import RecipeConfig
from tpuft.worker import data as data_mod
from tpuft.worker.context import WorkerContext
from tpuft.worker.metrics import Heartbeat
from tpuft.worker.resume import TRAINER_STATE, find_resume_checkpoint, load_resume_point, open_metrics, resuming
from tpuft.worker.schedule import lr_factor

OPTIMIZER_STATE = "optimizer.pt"
PROMPT_FILE = "prompt.safetensors"
"""Prompt tuning: the learned prompt, in each checkpoint and beside the Hugging Face export (``export/``)."""


def main(ctx: WorkerContext, recipe: RecipeConfig) -> int:
    tpu = os.environ.get("PJRT_DEVICE", "CPU").upper() == "TPU"
    if recipe.train.sharding == "fsdp":  # SPMD: one process per host drives every local chip
        return Trainer(ctx, recipe, tpu=tpu).run()
    if tpu:
        import torch_xla

        torch_xla.launch(_tpu_process, args=(ctx, recipe))
        return 0
    return Trainer(ctx, recipe, tpu=False).run()


def _tpu_process(_local_index: int, ctx: WorkerContext, recipe: RecipeConfig) -> None:
    Trainer(ctx, recipe, tpu=True).run()


# ----------------------------------------------------------------------------------------------------------------
# Replication strategies


class _Single:
    """One replica: nothing to average."""

    rank = 0
    world = 1
    local_rank = 0

    def reduce_gradients(self, params: list[Any], optimizer: Any, extras: Any) -> Any:
        return extras

    def sum(self, tensor: Any) -> Any:
        return tensor

    def close(self) -> None:
        pass


class _Gloo:
    """CPU pod: gradients go to the host, are averaged with gloo, and come back to the XLA device."""

    def __init__(self, rank: int, world: int, coordinator: str, device: Any) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.rank, self.world, self.device = rank, world, device
        self.local_rank = 0  # one process per worker
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{coordinator}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(minutes=30),
        )

    def reduce_gradients(self, params: list[Any], optimizer: Any, extras: Any) -> Any:
        import torch

        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads] + [extras.reshape(-1).to(grads[0].dtype)])
        host = flat.cpu()  # runs the forward/backward graph
        self.dist.all_reduce(host)
        host /= self.world
        back = host.to(self.device)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(back[offset : offset + n].view_as(g))
            offset += n
        return host[offset:]

    def sum(self, tensor: Any) -> Any:
        host = tensor.cpu()
        self.dist.all_reduce(host)
        return host

    def close(self) -> None:
        self.dist.destroy_process_group()


class _SpmdHosts:
    """TPU with ``train.sharding: fsdp``: one SPMD program over every chip of every host. Each host feeds its slice
    of the global batch; the compiler inserts the gradient reductions, so there is nothing to average, and a sum
    over the global batch is already global."""

    implicit = True

    def __init__(self) -> None:
        import torch_xla.runtime as xr

        self.rank, self.world = xr.process_index(), xr.process_count()
        self.local_rank = 0

    def reduce_gradients(self, params: list[Any], optimizer: Any, extras: Any) -> Any:
        return extras

    def sum(self, tensor: Any) -> Any:
        return tensor.cpu()

    def close(self) -> None:
        pass


class _XlaCollectives:
    """TPU: every chip of every host is a replica; XLA all-reduces over ICI/DCN inside the step's graph."""

    def __init__(self) -> None:
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr

        self.xm = xm
        self.rank, self.world = xr.global_ordinal(), xr.world_size()
        self.local_rank = xr.local_ordinal()  # one process per chip; the first one speaks for the host

    def reduce_gradients(self, params: list[Any], optimizer: Any, extras: Any) -> Any:
        self.xm.reduce_gradients(optimizer)
        return self.xm.all_reduce(self.xm.REDUCE_SUM, extras, scale=1.0 / self.world)

    def sum(self, tensor: Any) -> Any:
        return self.xm.all_reduce(self.xm.REDUCE_SUM, tensor).cpu()

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------------------------------------------


@dataclass
class _Batch:
    input_ids: Any
    attention_mask: Any
    labels: Any
    weights: Any
    tokens: int
    """Input and target tokens (for throughput)."""


class Trainer:
    def __init__(self, ctx: WorkerContext, recipe: RecipeConfig, *, tpu: bool) -> None:
        self.ctx = ctx
        self.recipe = recipe
        self.tpu = tpu
        self.spmd = recipe.train.sharding == "fsdp"
        self.mesh: Any = None

    # -- setup ----------------------------------------------------------------------------------------------
    def run(self) -> int:
        self.setup()
        try:
            self.train()
            self.finish()
        finally:
            self.metrics.close()
            self.replicas.close()
            if hasattr(self, "batches"):
                self.batches.close()  # data-loader processes
        return 0

    def setup(self) -> None:
        import torch
        import torch_xla
        import transformers

        self.setup_started = time.time()
        self.first_step_s: float | None = None
        self.first_step_logged = False
        transformers.utils.logging.disable_progress_bar()  # per-file bars garble the interleaved worker logs
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        if cpus:
            torch.set_num_threads(len(cpus))
        self.torch = torch
        self.torch_xla = torch_xla
        if self.spmd:
            self._setup_mesh()
        self.device = torch_xla.device()
        if self.tpu and self.spmd:
            self.replicas: Any = _SpmdHosts()
        elif self.tpu:
            self.replicas = _XlaCollectives()
        elif self.ctx.num_workers > 1:
            self.replicas = _Gloo(self.ctx.worker_id, self.ctx.num_workers, self.ctx.coordinator, self.device)
        else:
            self.replicas = _Single()
        self.chief = self.replicas.rank == 0
        # Heartbeats are per worker host (what monitor shows), written by the host's first process.
        self.heartbeat = Heartbeat(self.ctx.run_dir, self.ctx.worker_id, self.recipe.train.steps)
        self.beats = self.replicas.local_rank == 0
        self.resuming = resuming()
        found = find_resume_checkpoint(self.ctx, LAYOUT) if self.resuming else None
        self.start_step = found[0] if found else 0
        self._beat(self.start_step, phase="starting")
        self._say(
            f"worker {self.ctx.worker_id}/{self.ctx.num_workers}: replica {self.replicas.rank} of "
            f"{self.replicas.world} on {self.device} (torch {torch.__version__}, torch_xla {torch_xla.__version__})"
        )
        start = load_resume_point(self.ctx, LAYOUT, found, self.recipe.train.steps, self._say)
        self.checkpoint, self.trainer_state = start.checkpoint, start.state
        self.metrics = open_metrics(self.ctx, chief=self.chief, restart_at=self.start_step if self.resuming else None)
        from tpuft.worker.selection import Selector

        self.selector = Selector(self.recipe.eval.metric, self.recipe.train.early_stopping, self.trainer_state)
        self.stopped_early: str | None = None
        self.last_eval: dict[str, Any] = {}
        self.saved_steps: set[int] = set()
        self._setup_tokenizer()
        self._setup_model()
        self._setup_optimizer()
        self._setup_data()
        if self.resuming:
            self._check_same_start()

    def _setup_mesh(self) -> None:
        """FSDP via SPMD (FSDPv2's layout): a 1-D mesh named ``fsdp`` over every device of every host; parameters
        are sharded on it as ``tpuft.fsdp_plan`` says, the batch on its first dimension. On the CPU pod the mesh is
        this worker's CPU devices (``CPU_NUM_DEVICES``; one is still the SPMD code path) and workers average
        gradients over gloo as in data-parallel runs."""
        import numpy as np
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()  # before the first device is touched
        devices = xr.global_runtime_device_count()
        self.mesh = xs.Mesh(np.arange(devices), (devices,), ("fsdp",))
        xs.set_global_mesh(self.mesh)
        self.local_devices = xr.addressable_runtime_device_count()

    def _shard_parameters(self) -> None:
        from tpuft.fsdp_plan import partition_spec
        import torch_xla.distributed.spmd as xs

        size = self.mesh.size()
        named = list(self.model.named_parameters()) + ([("prompt.weight", self.prompt.weight)] if self.prompt is not None else [])
        self.shard_specs: dict[int, tuple[str | None, ...]] = {}
        """The partition spec of each sharded parameter (by id), which its optimizer state gets too."""
        for name, param in named:
            spec = partition_spec(name, tuple(param.shape), size)
            if any(axis is not None for axis in spec):
                xs.mark_sharding(param, self.mesh, spec)
                self.shard_specs[id(param)] = spec
        self._say(f"fsdp: {len(self.shard_specs)} parameter tensors sharded over a mesh of {size} devices")

    def _to_device(self, *tensors: Any) -> list[Any]:
        """Host tensors to the device; under SPMD each host's batch becomes its slice of the global batch, sharded
        on the batch dimension."""
        if self.mesh is None:
            return [t.to(self.device) for t in tensors]
        import torch_xla.core.xla_model as xm
        import torch_xla.distributed.spmd as xs

        out = []
        for tensor in tensors:
            spec = xs.ShardingSpec(self.mesh, ("fsdp", *([None] * (tensor.dim() - 1))), minibatch=True)
            out.append(xm.send_cpu_data_to_device([tensor], self.device, spec)[0])
        return out

    def _beat(self, step: int, status: str = "running", phase: str = "step", **extra: Any) -> None:
        if self.beats:
            self.heartbeat.beat(step, status, phase, **extra)

    def _check_same_start(self) -> None:
        """Every replica picks the latest complete checkpoint itself: make sure they all picked the same one (a
        replica that went on from another step would silently train different weights)."""
        if self.replicas.world == 1 or getattr(self.replicas, "implicit", False):
            return
        parts = [self.start_step % 4096, self.start_step // 4096]  # int32-safe sums over thousands of replicas
        total = self.replicas.sum(self.torch.tensor(parts, dtype=self.torch.int32, device=self.device))
        if [int(v) for v in total] != [v * self.replicas.world for v in parts]:
            raise RuntimeError(
                f"replica {self.replicas.rank} resumes from step {self.start_step}, but not every replica does: "
                "the workers see different checkpoints"
            )

    def _say(self, message: str, *, everyone: bool = False) -> None:
        if everyone or self.chief:
            print(f"[tpuft] {message}", flush=True)

    def _setup_tokenizer(self) -> None:
        self.tokenizer = data_mod.load_tokenizer(self.recipe.model.tokenizer)

    def _setup_model(self) -> None:
        from transformers import T5Config, T5ForConditionalGeneration

        from tpuft.worker import torch_parts

        torch = self.torch
        model_cfg = self.recipe.model
        torch.manual_seed(self.recipe.train.seed)  # identical initial weights on every replica
        overrides: dict[str, Any] = {}
        if model_cfg.dropout is not None:
            overrides["dropout_rate"] = model_cfg.dropout
        if self.checkpoint is not None:  # the config (overrides included) and the weights at the checkpoint
            model = T5ForConditionalGeneration.from_pretrained(self.checkpoint, **overrides)
        elif model_cfg.config is not None:
            settings = {
                "vocab_size": len(self.tokenizer),
                "pad_token_id": self.tokenizer.pad_token_id,
                "eos_token_id": self.tokenizer.eos_token_id,
                "decoder_start_token_id": self.tokenizer.pad_token_id,
                **model_cfg.config.kwargs(),
                **overrides,
            }
            model = T5ForConditionalGeneration(T5Config(**settings))
        else:
            model = T5ForConditionalGeneration.from_pretrained(model_cfg.name_or_path, **overrides)
        if model_cfg.gradient_checkpointing:
            self._checkpoint_activations(model)
        tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
        self.model = model.to(self.device)
        if tied:  # moving to an XLA device un-shares the embedding tables; share them again (only if they were:
            self.model.tie_weights()  # a T5 v1.1 / mT5 checkpoint's own output layer must survive)
        self.prompt: Any = None  # a torch_parts.SoftPrompt when prompt tuning
        tuning = model_cfg.prompt_tuning
        if tuning is not None:  # the whole model is frozen; only the prompt learns
            self.model.requires_grad_(False)
            self.prompt = torch_parts.SoftPrompt(self.model.get_input_embeddings(), tuning.tokens, tuning.init,
                                                 self.recipe.train.seed)
            if self.checkpoint is not None:
                from safetensors.torch import load_file

                self.prompt.weight.data.copy_(load_file(str(self.checkpoint / PROMPT_FILE))["prompt"])
            self.prompt.to(self.device)
            self.named_params = [("prompt.weight", self.prompt.weight)]
        else:
            frozen = torch_parts.freeze(self.model, model_cfg.freeze)
            if frozen:
                self._say(f"frozen: {', '.join(model_cfg.freeze)} ({len(frozen)} tensors)")
            self.named_params = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        if self.mesh is not None:
            self._shard_parameters()
        self.params = [p for _, p in self.named_params]
        count = sum(p.numel() for p in self.model.parameters())
        trainable = sum(p.numel() for p in self.params)
        origin = self.checkpoint or ("random init" if model_cfg.config is not None else model_cfg.name_or_path)
        self._say(f"model: {count / 1e6:.2f}M parameters, {trainable / 1e6:.3f}M trained ({origin})")

    def _checkpoint_activations(self, model: Any) -> None:
        """Recompute each block's activations in the backward pass. On XLA the checkpoint must be torch_xla's, which
        puts an optimization barrier before the saved inputs (or the compiler merges the recomputation back into
        the forward pass and nothing is saved); it is re-entrant, so the input embeddings are made to require grad."""
        from functools import partial

        import torch_xla.utils.checkpoint as xla_checkpoint

        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable({"use_reentrant": True})
        model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=partial(xla_checkpoint.checkpoint, use_reentrant=True))
        model.config.use_cache = False

    def _setup_optimizer(self) -> None:
        from tpuft.worker import torch_parts

        torch = self.torch
        train = self.recipe.train
        groups = torch_parts.parameter_groups(self.named_params, train.weight_decay)
        self.optimizer = torch_parts.make_optimizer(train, groups)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor(train.steps, train.warmup_steps, train.schedule))
        if self.checkpoint is not None:
            saved = torch.load(self.checkpoint / OPTIMIZER_STATE, map_location="cpu", weights_only=True)
            self.optimizer.load_state_dict(saved["optimizer"])  # moves the state onto the parameters' device
            self.scheduler.load_state_dict(saved["scheduler"])
            if self.mesh is not None:  # loaded state is replicated: shard it like its parameter
                self._shard_optimizer_state()

    def _shard_optimizer_state(self) -> None:
        import torch_xla.distributed.spmd as xs

        for param in self.params:
            spec = self.shard_specs.get(id(param))
            if spec is None:
                continue
            for value in self.optimizer.state.get(param, {}).values():
                if isinstance(value, self.torch.Tensor) and value.shape == param.shape:
                    xs.mark_sharding(value, self.mesh, spec)

    def _setup_data(self) -> None:
        from tpuft.worker.hf_data import load_eval_examples, open_train_stream

        cfg = self.recipe.data
        world, rank = self.replicas.world, self.replicas.rank
        if self.recipe.train.batch_size % world:
            raise ValueError(
                f"train.batch_size ({self.recipe.train.batch_size}) must be divisible by the number of replicas ({world})"
            )
        self.local_batch = self.recipe.train.batch_size // world
        self.local_eval_batch = max(1, self.recipe.eval.batch_size // world)
        if self.mesh is not None:  # the batch dimension is sharded over this host's devices
            devices = self.local_devices
            self.local_eval_batch = -(-self.local_eval_batch // devices) * devices
        saved_world = self.trainer_state.get("replicas", world)
        if saved_world != world:
            self._say(
                f"the checkpoint was written by {saved_world} replicas and this run has {world}: the data is sharded "
                "differently, so this run goes on from the checkpoint but not exactly as the original would have"
            )
        position = self.trainer_state.get("data_position") if self.checkpoint is not None else None
        if self.checkpoint is not None and position is None:  # a checkpoint from before data positions were saved
            position = {"consumed": self.start_step * self.local_batch}
        self.batches = open_train_stream(cfg, rank=rank, world=world, local_batch=self.local_batch,
                                         seed=self.recipe.train.seed, position=position)
        has_eval = cfg.eval is not None or (cfg.hf is not None and cfg.hf.eval_split is not None)
        self.eval_shard: list[data_mod.Example] | None = None
        self.generate_shard: list[data_mod.Example] = []
        if has_eval:
            self.eval_shard = load_eval_examples(cfg, rank=rank, world=world, limit=self.recipe.eval.max_examples)
            wanted = self.recipe.eval.generate_examples  # the first ones of the set, wherever their shard is
            self.generate_shard = self.eval_shard[: len(range(rank, wanted, world))]
        self._say(
            f"data: {getattr(self.batches, 'examples', 'streamed')} train / {len(self.eval_shard or [])} eval "
            f"examples on replica {rank} (batch {self.local_batch} per replica, {self.recipe.train.batch_size} "
            f"global{', ' + str(self.recipe.train.grad_accum_steps) + ' micro-batches a step' if self.recipe.train.grad_accum_steps > 1 else ''})",
            everyone=True,
        )

    def _encode(self, examples: list[data_mod.Example], pad_to: int | None = None) -> _Batch:
        torch = self.torch
        cfg = self.recipe.data
        real = len(examples)
        sources = [e.source for e in examples]
        targets = [e.target for e in examples]
        if pad_to is not None and real < pad_to:  # static shapes: fill with weight-0 rows
            sources += [""] * (pad_to - real)
            targets += [""] * (pad_to - real)
        ids, mask = data_mod.encode_texts(self.tokenizer, sources, cfg.max_source_length, cfg.truncation)
        enc = {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}
        dec = self.tokenizer(targets, max_length=cfg.max_target_length, padding="max_length", truncation=True, return_tensors="pt")
        labels = dec["input_ids"].clone()
        labels[dec["attention_mask"] == 0] = -100
        weights = torch.zeros(len(sources))
        weights[:real] = 1.0
        tokens = int(enc["attention_mask"][:real].sum() + dec["attention_mask"][:real].sum())
        input_ids, attention_mask, labels_on, weights_on = self._to_device(
            enc["input_ids"], enc["attention_mask"], labels, weights)
        return _Batch(
            input_ids=input_ids,
            attention_mask=attention_mask,
            labels=labels_on,
            weights=weights_on,
            tokens=tokens,
        )

    # -- training -------------------------------------------------------------------------------------------
    def train(self) -> None:
        torch = self.torch
        train = self.recipe.train
        self.step = self.start_step
        window_start = time.time()
        window: list[Any] = []  # per step: [loss, tokens] averaged over replicas
        self.run_started = time.time() - float(self.trainer_state.get("elapsed_s", 0.0))
        self._say(f"training steps {self.step + 1} to {train.steps}" if self.step else f"training for {train.steps} steps")
        if self.checkpoint is not None:
            self._zero_grads()
        self._seed_rngs()  # after the last sync before the first step: each sync moves the XLA seed on
        # The heartbeat says "starting" until the step's graph stops changing (XLA compiles each new one, which may take
        # minutes): a fresh run's first step creates the optimizer state and the gradients inside its graph, so its
        # second step compiles again; a resumed run has both in place from the start.
        warm_at = self.step + (1 if self.checkpoint is not None else 2)
        if self.selector.stopped_early:  # the checkpoint is where an early-stopped run ended: nothing more to train
            self.stopped_early = self.selector.stopped_early
            self._say(f"resumed after {self.stopped_early}")
            return
        collective = self.replicas.world > 1
        accum = train.grad_accum_steps
        micro = self.local_batch // accum
        while self.step < train.steps:
            examples = next(self.batches)
            pieces = [self._encode(examples[i * micro : (i + 1) * micro]) for i in range(accum)]
            # The loss is summed over tokens and divided by the tokens of the whole step: accumulated micro-batches
            # give the update one batch of them all would.
            # (on the device: under SPMD the step's tokens are those of the global batch, which no host counts)
            scale = 1.0 / torch.stack([(p.labels != -100).sum() for p in pieces]).sum().clamp(min=1).float()
            self.model.train()
            loss = None
            for index, piece in enumerate(pieces):
                part = self._loss_sum(piece) * scale
                part.backward()
                loss = part.detach() if loss is None else loss + part.detach()
                if index < accum - 1:
                    self.torch_xla.sync()  # one micro-batch per graph: activations of one at a time
            tokens = torch.tensor(float(sum(p.tokens for p in pieces)), device=self.device)
            extras = torch.stack([loss, tokens])
            if collective and self.step >= warm_at:
                self._beat(self.step, phase="collective")
            window.append(self.replicas.reduce_gradients(self.params, self.optimizer, extras))
            if train.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(self.params, train.max_grad_norm)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=False)
            self.torch_xla.sync()
            self.step += 1
            if self.first_step_s is None:  # wait for the step itself: compilation and all, as a user waits
                window[-1].to("cpu")
                self.first_step_s = round(time.time() - self.setup_started, 2)
                self._say(f"first step done {self.first_step_s:.1f}s after start-up (model, data, compilation)")
            logged: dict[str, Any] = {}  # what the heartbeat repeats of a metrics row
            if self.step % train.log_every == 0 or self.step == train.steps:
                stats = torch.stack([w.detach().to("cpu").float() for w in window])
                elapsed = time.time() - window_start
                loss_value = float(stats[:, 0].mean())
                row = {
                    "loss": round(loss_value, 6),
                    "lr": self.scheduler.get_last_lr()[0],
                    "examples_per_s": round(len(window) * train.batch_size / elapsed, 2),
                    "tokens_per_s": round(float(stats[:, 1].sum()) * self.replicas.world / elapsed, 1),
                    "elapsed_s": round(time.time() - self.run_started, 1),
                }
                if not self.first_step_logged:
                    row["first_step_s"] = self.first_step_s
                    self.first_step_logged = True
                self.metrics.log(self.step, row)
                logged = {k: row[k] for k in ("loss", "lr", "examples_per_s", "tokens_per_s")}
                self._say(
                    f"step {self.step}/{train.steps} loss {loss_value:.4f} lr {row['lr']:.2e} "
                    f"{row['examples_per_s']:.1f} ex/s {row['tokens_per_s']:.0f} tok/s"
                )
                window_start, window = time.time(), []
            self._beat(self.step, phase="step" if self.step >= warm_at else "starting", **logged)
            saved = False
            every = self.recipe.eval.every
            if every and self.step % every == 0 and self.step < train.steps and self.eval_shard is not None:
                self.last_eval = self.evaluate()
                verdict = self.selector.judge(self.step, self.last_eval)
                if verdict.stop:
                    self.stopped_early = verdict.reason
                    self._say(f"{verdict.reason}")
                    break
                if verdict.improved and train.keep_best:
                    self.save_checkpoint()  # the best so far becomes a checkpoint, whatever checkpoint_every says
                    saved = True
            ckpt_every = train.checkpoint_every
            if ckpt_every and self.step % ckpt_every == 0 and self.step < train.steps and not saved:
                self.save_checkpoint()
                saved = True
            if saved:
                self._seed_rngs()  # where a run resumed from this checkpoint starts: the same draws from here on

    def _autocast(self) -> Any:
        """bf16 compute (``train.precision``): XLA's autocast, which on a TPU is what torch_xla.amp does and on the
        CPU pod runs the same bf16 casts on the CPU; weights, gradients and the optimizer stay float32."""
        return self.torch.autocast("xla", dtype=self.torch.bfloat16, enabled=self.recipe.train.precision == "bf16")

    def _logits(self, batch: _Batch) -> Any:
        from tpuft.worker import torch_parts

        inputs = torch_parts.encoder_inputs(self.model, self._prompt_vectors(), batch.input_ids, batch.attention_mask)
        with self._autocast():
            return self.model(**inputs, decoder_input_ids=self.model._shift_right(batch.labels), use_cache=False).logits

    def _prompt_vectors(self) -> Any:
        return None if self.prompt is None else self.prompt.weight

    def _loss_sum(self, batch: _Batch) -> Any:
        from tpuft.worker import torch_parts

        return torch_parts.token_loss_sum(self._logits(batch), batch.labels, self.recipe.train.label_smoothing)

    def _seed_rngs(self) -> None:
        """Seed python's ``random``, torch's CPU generator and the XLA device RNG from (seed, replica, step): done
        at the start and after every checkpoint step, so that a run resumed from a checkpoint draws what the run
        uninterrupted drew, on every replica, with nothing saved (and each replica draws its own dropout masks).
        Every ``torch_xla.sync()`` moves the XLA seed on, so no sync may come between this and the next step."""
        import random

        import torch_xla.core.xla_model as xm

        seed = rng_seed(self.recipe.train.seed, self.replicas.rank, self.step)
        random.seed(seed)
        self.torch.manual_seed(seed)
        xm.set_rng_state(seed, str(self.device))

    def _zero_grads(self) -> None:
        """After its first step a run holds zero-filled gradients (``zero_grad(set_to_none=False)``) into which the
        next backward pass accumulates. A resumed run starts from the same, so that its first step computes with the
        same graph as the uninterrupted run's step there (and XLA compiles one step graph, not two)."""
        for param in self.params:
            param.grad = self.torch.zeros_like(param)
        self.torch_xla.sync()

    def evaluate(self) -> dict[str, float]:
        """Teacher-forced loss, token accuracy and exact match over every replica's eval shard; BLEU and ROUGE-L of
        greedy decodes of the first ``eval.generate_examples`` held-out examples, decoded on the device (TPU or the
        CPU pod's XLA device) with static shapes and scored on the host."""
        torch = self.torch
        if self.eval_shard is None:
            return {}
        self._beat(self.step, phase="eval")
        self.model.eval()
        sums = torch.zeros(5, device=self.device)  # loss*tokens, tokens, correct tokens, exact, examples
        started = time.time()
        with torch.no_grad():
            for start in range(0, len(self.eval_shard), self.local_eval_batch):
                chunk = self.eval_shard[start : start + self.local_eval_batch]
                batch = self._encode(chunk, pad_to=self.local_eval_batch)
                logits = self._logits(batch)
                mask = (batch.labels != -100) & (batch.weights[:, None] > 0)
                safe_labels = batch.labels.clamp(min=0)
                token_loss = torch.nn.functional.cross_entropy(
                    logits.float().reshape(-1, logits.shape[-1]), safe_labels.reshape(-1), reduction="none"
                ).view_as(safe_labels)
                correct = (logits.argmax(-1) == safe_labels) & mask
                exact = ((correct | ~mask).all(-1) & (batch.weights > 0)).float()
                sums = sums + torch.stack(
                    [(token_loss * mask).sum(), mask.sum().float(), correct.sum().float(), exact.sum(), batch.weights.sum()]
                )
                self.torch_xla.sync()
            decoded = self._decode(self.generate_shard) if self.recipe.eval.generate_examples else None
        totals = self.replicas.sum(sums)
        loss_sum, tokens, correct_tokens, exact_sum, examples = (float(x) for x in totals)
        result = {
            "eval_loss": round(loss_sum / max(tokens, 1.0), 6),
            "eval_token_accuracy": round(correct_tokens / max(tokens, 1.0), 6),
            "eval_exact_match": round(exact_sum / max(examples, 1.0), 6),
            "eval_examples": int(examples),
        }
        if decoded is not None:
            result.update(self._text_scores(decoded))
        result["eval_seconds"] = round(time.time() - started, 2)
        self.metrics.log(self.step, result)
        scores = "".join(f" {key[5:]} {result[key]:.2f}" for key in ("eval_bleu", "eval_rouge_l") if key in result)
        self._say(
            f"eval @ {self.step}: loss {result['eval_loss']:.4f} token acc {result['eval_token_accuracy']:.4f} "
            f"exact match {result['eval_exact_match']:.4f}{scores} ({result['eval_examples']} examples)"
        )
        self.model.train()
        return result

    def _decode(self, examples: list[data_mod.Example]) -> list[str]:
        """Greedy decodes of ``examples`` (this replica's share), as text, in batches of the eval batch."""
        from tpuft.worker import torch_parts

        texts: list[str] = []
        eos = self.tokenizer.eos_token_id
        for start in range(0, len(examples), self.local_eval_batch):
            chunk = examples[start : start + self.local_eval_batch]
            batch = self._encode(chunk, pad_to=self.local_eval_batch)
            with self._autocast():
                ids = torch_parts.greedy_decode(self.model, self._prompt_vectors(), batch.input_ids, batch.attention_mask,
                                                self.recipe.data.max_target_length, self.torch_xla.sync)
            for row in ids[: len(chunk)].to("cpu").tolist():
                row = row[: row.index(eos)] if eos in row else row
                texts.append(self.tokenizer.decode(row, skip_special_tokens=True))
        return texts

    def _text_scores(self, decoded: list[str]) -> dict[str, float]:
        """Corpus BLEU and mean ROUGE-L over every replica's decodes, from sufficient statistics summed across
        replicas (a corpus BLEU is not the mean of per-replica BLEUs)."""
        from tpuft.worker import text_metrics

        references = [e.target for e in self.generate_shard]
        local = [*text_metrics.bleu_statistics(decoded, references), text_metrics.rouge_l_sum(decoded, references),
                 float(len(decoded))]
        totals = [float(x) for x in self.replicas.sum(self.torch.tensor(local, dtype=self.torch.float64, device="cpu")
                                                      .to(self.device))]
        self.last_decodes = list(zip(self.generate_shard, decoded))
        return {
            "eval_bleu": round(text_metrics.bleu_from_statistics(totals[:-2]), 4),
            "eval_rouge_l": round(100.0 * totals[-2] / max(totals[-1], 1.0), 4),
            "eval_decoded": int(totals[-1]),
        }

    # -- checkpoints and the end ------------------------------------------------------------------------------
    def _cpu_state(self) -> dict[str, Any]:
        return {k: v.detach().to("cpu") for k, v in self.model.state_dict().items()}

    def _trained_state(self) -> dict[str, Any]:
        """What the weight digest covers: the model, and the prompt when prompt tuning."""
        state = self._cpu_state()
        if self.prompt is not None:
            state["prompt.weight"] = self.prompt.weight.detach().to("cpu")
        return state

    def save_checkpoint(self) -> Path | None:
        """Worker 0 writes ``checkpoints/step_N`` (HF weights + optimizer + trainer state) via a temp dir."""
        if not self.chief or self.step in self.saved_steps:
            return LAYOUT.checkpoint_dir(self.ctx.run_dir, self.step) if self.chief else None
        torch = self.torch
        self._beat(self.step, phase="checkpoint")
        final = LAYOUT.checkpoint_dir(self.ctx.run_dir, self.step)
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        started = time.time()
        elapsed = started - self.run_started
        self.model.save_pretrained(tmp, state_dict=self._cpu_state(), safe_serialization=True)
        self.tokenizer.save_pretrained(tmp)
        if self.prompt is not None:
            from safetensors.torch import save_file

            save_file({"prompt": self.prompt.weight.detach().to("cpu").contiguous()}, str(tmp / PROMPT_FILE))
        optimizer_state = _to_cpu(torch, self.optimizer.state_dict())
        torch.save({"optimizer": optimizer_state, "scheduler": self.scheduler.state_dict()}, tmp / OPTIMIZER_STATE)
        state = {
            "step": self.step, "run_id": self.ctx.run_id, "recipe": self.recipe.name, "backend": "torch_xla",
            "tokenizer": self.recipe.model.tokenizer, "time": time.time(), "elapsed_s": elapsed,
            "replicas": self.replicas.world, "examples_per_replica": self.step * self.local_batch,
            "data_position": self.batches.position(), **self.selector.state(),
            "rng": "reseeded from (train.seed, replica, step) at this step",
        }  # fmt: skip
        (tmp / TRAINER_STATE).write_text(json.dumps(state, indent=2))
        LAYOUT.write_manifest(tmp)  # last: the checkpoint is complete once every file it lists is there
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        self.saved_steps.add(self.step)
        keep = {step for step, _ in LAYOUT.local_checkpoints(self.ctx.run_dir / LAYOUT.checkpoints)[-self.recipe.train.keep_checkpoints :]}
        best = self.selector.best
        if self.recipe.train.keep_best and best is not None:
            keep.add(int(best["step"]))  # the best evaluation's checkpoint stays besides the last ones
        for step, old in LAYOUT.local_checkpoints(self.ctx.run_dir / LAYOUT.checkpoints):
            if step not in keep:
                shutil.rmtree(old, ignore_errors=True)
        self._say(f"checkpoint saved: {final} ({time.time() - started:.1f}s)")
        return final

    def finish(self) -> None:
        if self.stopped_early is None:  # an early stop has just evaluated at this step
            result = self.evaluate()
            if result:
                self.selector.judge(self.step, result)
            self.last_eval = result
        ckpt = self.save_checkpoint()  # the loop never saves at the last step: this is the final checkpoint
        digest = params_digest(self._trained_state())
        self._say(f"weights sha256 {digest[:16]} (replica {self.replicas.rank})", everyone=True)
        if self.chief and self.recipe.export.hf and ckpt is not None:
            from tpuft.convert.hf_ckpt import export_checkpoint

            best = self.selector.best
            if self.recipe.train.keep_best and best is not None and int(best["step"]) != self.step:
                ckpt = LAYOUT.checkpoint_dir(self.ctx.run_dir, int(best["step"]))
                self._say(f"exporting the best checkpoint: step {best['step']} ({best['metric']} {best['value']:.4f})")
            out = self.ctx.run_dir / rundir.EXPORT_HF
            self._beat(self.step, phase="export")
            export_checkpoint(ckpt, out, dtype=self.recipe.export.dtype)
            self._say(f"Hugging Face export: {out}")
            if self.prompt is not None:  # beside the HF dir: the frozen model plus this file is the tuned model
                shutil.copyfile(ckpt / PROMPT_FILE, out.parent / PROMPT_FILE)
                self._say(f"soft prompt: {out.parent / PROMPT_FILE} ({self.prompt.weight.shape[0]} vectors)")
            self._show_samples(out)
        extra = {k: v for k, v in self.last_eval.items() if k.startswith("eval_")}
        if self.stopped_early:
            extra["stopped_early"] = self.stopped_early
        self._beat(
            self.step,
            "finished",
            params_sha256=digest,
            train_seconds=round(time.time() - self.run_started, 1),
            **extra,
        )

    def _show_samples(self, export_dir: Path, count: int = 3) -> None:
        """Greedy-decode a few held-out inputs with the exported model (and the soft prompt), on the host CPU, as a
        user would."""
        if not self.eval_shard:
            return
        from transformers import T5ForConditionalGeneration

        model = T5ForConditionalGeneration.from_pretrained(export_dir)
        examples = self.eval_shard[:count]
        enc = self.tokenizer([e.source for e in examples], return_tensors="pt", padding=True)
        with self.torch.no_grad():
            if self.prompt is not None:
                from safetensors.torch import load_file

                from tpuft.worker import torch_parts

                prompt = load_file(str(export_dir.parent / PROMPT_FILE))["prompt"]
                enc = torch_parts.encoder_inputs(model, prompt, enc["input_ids"], enc["attention_mask"])
            out = model.generate(**enc, max_new_tokens=self.recipe.data.max_target_length)
        lines = []
        for example, text in zip(examples, self.tokenizer.batch_decode(out, skip_special_tokens=True)):
            mark = "ok" if text == example.target else "MISS"
            lines.append(f"{example.source!r} -> {text!r} (expected {example.target!r}) {mark}")
        for line in lines:
            self._say(f"sample: {line}")
        self.metrics.log_text(self.step, "samples", "\n\n".join(lines))


# ----------------------------------------------------------------------------------------------------------------
# Small pure helpers (unit-tested without a device)


def rng_seed(seed: int, replica: int, step: int) -> int:
    """The RNG seed of ``replica`` from ``step`` on: a hash, so that nearby (seed, replica, step) give unrelated
    streams; below 2**63, which every generator takes."""
    digest = hashlib.sha256(f"tpuft-rng {seed} {replica} {step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def params_digest(state: dict[str, Any]) -> str:
    """sha256 over every tensor in name order, each framed by its name, dtype and shape (so that neither a renamed,
    a reshaped nor a differently split tensor can give the same bytes): equal digests mean identical weights."""
    import torch

    digest = hashlib.sha256(f"tpuft-weights-v1 {len(state)}".encode())
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        digest.update(f"\0{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _to_cpu(torch: Any, obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu")
    if isinstance(obj, dict):
        return {k: _to_cpu(torch, v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(torch, v) for v in obj)
    return obj
