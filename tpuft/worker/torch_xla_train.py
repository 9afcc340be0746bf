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


def main(ctx: WorkerContext, recipe: RecipeConfig) -> int:
    if os.environ.get("PJRT_DEVICE", "CPU").upper() == "TPU":
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


class Trainer:
    def __init__(self, ctx: WorkerContext, recipe: RecipeConfig, *, tpu: bool) -> None:
        self.ctx = ctx
        self.recipe = recipe
        self.tpu = tpu

    # -- setup ----------------------------------------------------------------------------------------------
    def run(self) -> int:
        self.setup()
        try:
            self.train()
            self.finish()
        finally:
            self.metrics.close()
            self.replicas.close()
        return 0

    def setup(self) -> None:
        import torch
        import torch_xla
        import transformers

        transformers.utils.logging.disable_progress_bar()  # per-file bars garble the interleaved worker logs
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        if cpus:
            torch.set_num_threads(len(cpus))
        self.torch = torch
        self.torch_xla = torch_xla
        self.device = torch_xla.device()
        if self.tpu:
            self.replicas: Any = _XlaCollectives()
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
        self._setup_tokenizer()
        self._setup_model()
        self._setup_optimizer()
        self._setup_data()
        if self.resuming:
            self._check_same_start()

    def _beat(self, step: int, status: str = "running", phase: str = "step", **extra: Any) -> None:
        if self.beats:
            self.heartbeat.beat(step, status, phase, **extra)

    def _check_same_start(self) -> None:
        """Every replica picks the latest complete checkpoint itself: make sure they all picked the same one (a
        replica that went on from another step would silently train different weights)."""
        if self.replicas.world == 1:
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
        self.model = model.to(self.device)
        self.model.tie_weights()  # moving to an XLA device un-shares the embedding tables; share them again
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        count = sum(p.numel() for p in self.params)
        origin = self.checkpoint or ("random init" if model_cfg.config is not None else model_cfg.name_or_path)
        self._say(f"model: {count / 1e6:.2f}M parameters ({origin})")

    def _setup_optimizer(self) -> None:
        torch = self.torch
        train = self.recipe.train
        if train.optimizer == "adafactor":
            from transformers.optimization import Adafactor

            self.optimizer = Adafactor(
                self.params,
                lr=train.learning_rate,
                scale_parameter=False,
                relative_step=False,
                warmup_init=False,
                weight_decay=train.weight_decay,
                clip_threshold=1.0,
            )
        else:
            self.optimizer = torch.optim.AdamW(
                self.params, lr=train.learning_rate, weight_decay=train.weight_decay, foreach=False
            )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor(train.steps, train.warmup_steps, train.schedule))
        if self.checkpoint is not None:
            saved = torch.load(self.checkpoint / OPTIMIZER_STATE, map_location="cpu", weights_only=True)
            self.optimizer.load_state_dict(saved["optimizer"])  # moves the state onto the parameters' device
            self.scheduler.load_state_dict(saved["scheduler"])

    def _setup_data(self) -> None:
        cfg = self.recipe.data
        world, rank = self.replicas.world, self.replicas.rank
        if self.recipe.train.batch_size % world:
            raise ValueError(
                f"train.batch_size ({self.recipe.train.batch_size}) must be divisible by the number of replicas ({world})"
            )
        self.local_batch = self.recipe.train.batch_size // world
        self.local_eval_batch = max(1, self.recipe.eval.batch_size // world)
        fields = data_mod.Fields.of(cfg)
        self.train_shard = data_mod.load_shard(cfg.train, rank, world, fields)
        self.eval_shard: list[data_mod.Example] = []
        if cfg.eval is not None:
            eval_examples = list(data_mod.iter_shard(cfg.eval, rank, world, fields))
            limit = self.recipe.eval.max_examples
            if limit is not None:  # the first `limit` examples of the file, wherever their shard is
                eval_examples = eval_examples[: len(range(rank, limit, world))]
            self.eval_shard = eval_examples
        self._say(
            f"data: {len(self.train_shard)} train / {len(self.eval_shard)} eval examples on replica {rank} "
            f"(batch {self.local_batch} per replica, {self.recipe.train.batch_size} global)",
            everyone=True,
        )
        saved_world = self.trainer_state.get("replicas", world)
        if saved_world != world:
            self._say(
                f"the checkpoint was written by {saved_world} replicas and this run has {world}: the data is sharded "
                "differently, so this run goes on from the checkpoint but not exactly as the original would have"
            )
        self.batches = data_mod.batches(
            self.train_shard, self.local_batch, self.recipe.train.seed + 7919 * rank, cfg.shuffle,
            consumed=self.start_step * self.local_batch,
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
        return _Batch(
            input_ids=enc["input_ids"].to(self.device),
            attention_mask=enc["attention_mask"].to(self.device),
            labels=labels.to(self.device),
            weights=weights.to(self.device),
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
        collective = self.replicas.world > 1
        while self.step < train.steps:
            batch = self._encode(next(self.batches))
            self.model.train()
            out = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels)
            out.loss.backward()
            extras = torch.stack([out.loss.detach(), torch.tensor(float(batch.tokens), device=self.device)])
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
            logged: dict[str, Any] = {}  # what the heartbeat repeats of a metrics row
            if self.step % train.log_every == 0 or self.step == train.steps:
                stats = torch.stack([w.detach().to("cpu").float() for w in window])
                elapsed = time.time() - window_start
                loss = float(stats[:, 0].mean())
                row = {
                    "loss": round(loss, 6),
                    "lr": self.scheduler.get_last_lr()[0],
                    "examples_per_s": round(len(window) * train.batch_size / elapsed, 2),
                    "tokens_per_s": round(float(stats[:, 1].sum()) * self.replicas.world / elapsed, 1),
                    "elapsed_s": round(time.time() - self.run_started, 1),
                }
                self.metrics.log(self.step, row)
                logged = {k: row[k] for k in ("loss", "lr", "examples_per_s", "tokens_per_s")}
                self._say(
                    f"step {self.step}/{train.steps} loss {loss:.4f} lr {row['lr']:.2e} "
                    f"{row['examples_per_s']:.1f} ex/s {row['tokens_per_s']:.0f} tok/s"
                )
                window_start, window = time.time(), []
            self._beat(self.step, phase="step" if self.step >= warm_at else "starting", **logged)
            every = self.recipe.eval.every
            if every and self.step % every == 0 and self.step < train.steps and self.recipe.data.eval is not None:
                self.evaluate()
            ckpt_every = train.checkpoint_every
            if ckpt_every and self.step % ckpt_every == 0 and self.step < train.steps:
                self.save_checkpoint()
                self._seed_rngs()  # where a run resumed from this checkpoint starts: the same draws from here on

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
        """Teacher-forced loss, token accuracy and exact match over every replica's eval shard."""
        torch = self.torch
        if self.recipe.data.eval is None:
            return {}
        self._beat(self.step, phase="eval")
        self.model.eval()
        sums = torch.zeros(5, device=self.device)  # loss*tokens, tokens, correct tokens, exact, examples
        started = time.time()
        with torch.no_grad():
            for start in range(0, len(self.eval_shard), self.local_eval_batch):
                chunk = self.eval_shard[start : start + self.local_eval_batch]
                batch = self._encode(chunk, pad_to=self.local_eval_batch)
                logits = self.model(
                    input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels
                ).logits
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
        totals = self.replicas.sum(sums)
        loss_sum, tokens, correct_tokens, exact_sum, examples = (float(x) for x in totals)
        result = {
            "eval_loss": round(loss_sum / max(tokens, 1.0), 6),
            "eval_token_accuracy": round(correct_tokens / max(tokens, 1.0), 6),
            "eval_exact_match": round(exact_sum / max(examples, 1.0), 6),
            "eval_examples": int(examples),
            "eval_seconds": round(time.time() - started, 2),
        }
        self.metrics.log(self.step, result)
        self._say(
            f"eval @ {self.step}: loss {result['eval_loss']:.4f} token acc {result['eval_token_accuracy']:.4f} "
            f"exact match {result['eval_exact_match']:.4f} ({result['eval_examples']} examples)"
        )
        self.model.train()
        return result

    # -- checkpoints and the end ------------------------------------------------------------------------------
    def _cpu_state(self) -> dict[str, Any]:
        return {k: v.detach().to("cpu") for k, v in self.model.state_dict().items()}

    def save_checkpoint(self) -> Path | None:
        """Worker 0 writes ``checkpoints/step_N`` (HF weights + optimizer + trainer state) via a temp dir."""
        if not self.chief:
            return None
        torch = self.torch
        self._beat(self.step, phase="checkpoint")
        final = LAYOUT.checkpoint_dir(self.ctx.run_dir, self.step)
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        started = time.time()
        elapsed = started - self.run_started
        self.model.save_pretrained(tmp, state_dict=self._cpu_state(), safe_serialization=True)
        self.tokenizer.save_pretrained(tmp)
        optimizer_state = _to_cpu(torch, self.optimizer.state_dict())
        torch.save({"optimizer": optimizer_state, "scheduler": self.scheduler.state_dict()}, tmp / OPTIMIZER_STATE)
        state = {
            "step": self.step, "run_id": self.ctx.run_id, "recipe": self.recipe.name, "backend": "torch_xla",
            "tokenizer": self.recipe.model.tokenizer, "time": time.time(), "elapsed_s": elapsed,
            "replicas": self.replicas.world, "examples_per_replica": self.step * self.local_batch,
            "rng": "reseeded from (train.seed, replica, step) at this step",
        }  # fmt: skip
        (tmp / TRAINER_STATE).write_text(json.dumps(state, indent=2))
        LAYOUT.write_manifest(tmp)  # last: the checkpoint is complete once every file it lists is there
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for _, old in LAYOUT.local_checkpoints(self.ctx.run_dir / LAYOUT.checkpoints)[: -self.recipe.train.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
        self._say(f"checkpoint saved: {final} ({time.time() - started:.1f}s)")
        return final

    def finish(self) -> None:
        result = self.evaluate()
        ckpt = self.save_checkpoint()  # the loop never saves at the last step: this is the final checkpoint
        digest = params_digest(self._cpu_state())
        self._say(f"weights sha256 {digest[:16]} (replica {self.replicas.rank})", everyone=True)
        if self.chief and self.recipe.export.hf and ckpt is not None:
            from tpuft.convert.hf_ckpt import export_checkpoint

            out = self.ctx.run_dir / rundir.EXPORT_HF
            self._beat(self.step, phase="export")
            export_checkpoint(ckpt, out, dtype=self.recipe.export.dtype)
            self._say(f"Hugging Face export: {out}")
            self._show_samples(out)
        self._beat(
            self.step,
            "finished",
            params_sha256=digest,
            train_seconds=round(time.time() - self.run_started, 1),
            **{k: v for k, v in result.items() if k.startswith("eval_")},
        )

    def _show_samples(self, export_dir: Path, count: int = 3) -> None:
        """Greedy-decode a few held-out inputs with the exported model, on the host CPU, as a user would."""
        if not self.eval_shard:
            return
        from transformers import T5ForConditionalGeneration

        model = T5ForConditionalGeneration.from_pretrained(export_dir)
        examples = self.eval_shard[:count]
        enc = self.tokenizer([e.source for e in examples], return_tensors="pt", padding=True)
        with self.torch.no_grad():
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
