"""PyTorch/XLA trainer: T5 (HF transformers) on the PJRT runtime, data-parallel across workers.

Reads top to bottom like a torchtune recipe: ``Trainer.setup()`` builds tokenizer, model, optimizer and data
(the model and optimizer, as a checkpoint holds them: :mod:`tpuft.worker.torch_xla.state`; the data:
:mod:`tpuft.worker.torch_xla.feed`);
the run sequencer (:mod:`tpuft.worker.loop.sequencer`: rows, progress line, heartbeats, periodic eval and
checkpoints, keep-best, early stopping, checkpoints on demand, ``train.time_limit``, the test evaluation, the
final export) drives the acts below: ``start``, ``train_step``, ``progress``, ``evaluate``
(:mod:`tpuft.worker.torch_xla.heldout`), ``test`` (:mod:`tpuft.worker.torch_xla.testset`), ``save``,
``digest``, ``export``, ``agree``. ``train()`` and ``finish()`` are the sequencer's two halves; at the end
every worker records its weight digest (all workers must end with identical weights).

Shapes are static (inputs padded to the recipe's max lengths, the last eval batch padded with weight-0 rows),
so XLA compiles a handful of graphs once. The learning rate changes every step without recompiling: torch-xla
passes Python scalars into graphs as data.

Replication (:mod:`tpuft.worker.torch_xla.replicas`): gloo between the local CPU pod's workers (each one SPMD
program over its CPU devices when it has several), XLA collectives between a TPU slice's chips (one process
per chip), or one SPMD program per host with ``train.sharding: fsdp`` or several slices
(:mod:`tpuft.worker.torch_xla.multislice`).

Resume (``TPUFT_RESUME=1``, set by the controller when it restarts a run): the trainer continues from the
run's latest complete checkpoint (listed in the bucket and downloaded by every worker for a ``gs://`` run) and
ends with the same weights as the run uninterrupted. A checkpoint holds the weights, the optimizer and LR
scheduler state, and in ``trainer_state.json`` the step and the elapsed training time. The rest is derived:
each replica's place in its data stream is step x local batch (``data.batches(consumed=...)``), and every
replica reseeds python's ``random``, torch's CPU generator and the XLA device RNG from (seed, replica, step)
at the start and after every checkpoint step, so an uninterrupted run and a resumed one draw the same dropout
masks on every replica without any replica's RNG state being saved. ``metrics.jsonl`` and TensorBoard forget
what was logged after the checkpoint.

Heartbeats: every step, with the trainer's phase (``starting`` until its step's graph is compiled,
``collective`` before the gradient all-reduce, ``step``, ``eval``, ``checkpoint``, ``export``) for the
worker's supervisor.

Eval exact match is computed with teacher forcing (:func:`tpuft.worker.torch_xla.parts.eval_sums`: no
dynamic-shape generation on the device); BLEU and ROUGE-L score greedy decodes made with static shapes.

Raises: DataError (a data file line is not JSON or lacks the configured field); ValueError (the global batch
does not split evenly over the replicas).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from tpuft import data as data_mod
from tpuft.backends.torch_xla_schema import LAYOUT
from tpuft.config import RecipeConfig
from tpuft.worker import loop as loop_mod
from tpuft.worker.compile_cache import start_torch_xla_cache
from tpuft.worker.context import WorkerContext
from tpuft.worker.export import export_hf
from tpuft.worker.loop import RunLoop
from tpuft.worker.torch_xla import heldout
from tpuft.worker.torch_xla.feed import setup_data
from tpuft.worker.torch_xla.multislice import trainer_mesh_line
from tpuft.worker.torch_xla.replicas import any_flag, make_replicas, params_digest, rng_seed
from tpuft.worker.torch_xla.state import (
    PROMPT_FILE,
    build_model,
    build_optimizer,
    cpu_state,
    write_checkpoint,
)

__all__ = ["Trainer", "main", "params_digest", "rng_seed"]


def main(ctx: WorkerContext, recipe: RecipeConfig) -> int:
    tpu = os.environ.get("PJRT_DEVICE", "CPU").upper() == "TPU"
    # over HybridMesh (libtpu's wait for every slice: worker/multislice.py)
    multislice = tpu and ctx.num_slices > 1
    if recipe.train.sharding == "fsdp" or multislice:  # SPMD: one process per host drives every local chip
        return Trainer(ctx, recipe, tpu=tpu).run()
    if tpu:
        import torch_xla

        torch_xla.launch(_tpu_process, args=(ctx, recipe))
        return 0
    return Trainer(ctx, recipe, tpu=False).run()


def _tpu_process(local_index: int, ctx: WorkerContext, recipe: RecipeConfig) -> None:
    Trainer(ctx, recipe, tpu=True, process=local_index).run()


class Trainer:
    """The engine (model, optimizer, data, replicas) and the hooks :mod:`tpuft.worker.loop` drives."""

    def __init__(self, ctx: WorkerContext, recipe: RecipeConfig, *, tpu: bool, process: int = 0) -> None:
        """``process``: this one's index among a TPU host's processes (one per chip), 0 for one per host."""
        self.compile_cache = start_torch_xla_cache(ctx.worker_id, process)  # before the runtime's first use
        self.ctx = ctx
        self.recipe = recipe
        self.tpu = tpu
        self.fsdp = recipe.train.sharding == "fsdp"
        self.spmd = self.fsdp or (tpu and ctx.num_slices > 1)  # one SPMD program per host (FSDP, Multislice)
        self.mesh: Any = None
        self.window: list[Any] = []
        """Per step since the last metrics row: [loss, tokens] averaged over replicas, on the device."""

    # -- the run: handed to the sequencer --------------------------------------------------------------------
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

    def train(self) -> None:
        loop_mod.train(self.loop, self)

    def finish(self) -> None:
        loop_mod.finish(self.loop, self)

    @property
    def step(self) -> int:
        return self.loop.step

    @property
    def metrics(self) -> Any:
        return self.loop.metrics

    @property
    def stopped_early(self) -> str | None:
        return self.loop.stopped_early

    def _say(self, message: str, *, everyone: bool = False) -> None:
        self.loop.say(message, everyone=everyone)

    # -- setup ----------------------------------------------------------------------------------------------
    def setup(self) -> None:
        import torch
        import torch_xla
        import transformers

        from tpuft.worker.torch_xla import sharding as torch_sharding

        setup_started = time.time()
        transformers.utils.logging.disable_progress_bar()  # per-file bars garble the interleaved worker logs
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        if cpus:
            torch.set_num_threads(len(cpus))
        self.torch = torch
        self.torch_xla = torch_xla
        ctx, self.local_devices = self.ctx, 1
        if self.spmd or (
            not self.tpu and torch_sharding.cpu_devices() > 1
        ):  # FSDP, Multislice, or data-parallel SPMD
            self.mesh, self.local_devices = torch_sharding.setup_mesh(
                "fsdp" if self.fsdp else "data", ctx.num_slices if self.tpu else 1
            )
        self.device = torch_xla.device()
        self.replicas = make_replicas(
            ctx,
            tpu=self.tpu,
            spmd=self.spmd,
            device=self.device,
            startup_timeout=self.recipe.train.startup_timeout,
        )
        self.chief = self.replicas.rank == 0
        # Heartbeats are per worker host (what monitor shows), written by the host's first process.
        self.loop = RunLoop(ctx, self.recipe, LAYOUT, chief=self.chief, beats=self.replicas.local_rank == 0)
        self.loop.setup_started = setup_started
        self.start_step = self.loop.find_checkpoint()
        self.loop.beat(self.start_step, phase="starting")
        self._say(
            f"worker {ctx.worker_id}/{ctx.num_workers}: replica {self.replicas.rank} of "
            f"{self.replicas.world} "
            f"on {self.device} (torch {torch.__version__}, torch_xla {torch_xla.__version__})"
        )
        self._say(trainer_mesh_line(self))
        start = self.loop.load_checkpoint()
        self.checkpoint, self.trainer_state = start.checkpoint, start.state
        self.tokenizer = data_mod.load_tokenizer(self.recipe.model.tokenizer)
        build_model(self)
        build_optimizer(self)
        setup_data(self)
        self.loop.has_eval, self.loop.has_test = self.eval_shard is not None, self.test_shard is not None
        if self.loop.resuming:
            from tpuft.worker.torch_xla.replicas import check_same_start

            check_same_start(self.replicas, self.torch, self.device, self.start_step)

    def _encode(self, examples: list[data_mod.Example], pad_to: int | None = None) -> Any:
        from tpuft.worker.torch_xla import parts as torch_parts

        return torch_parts.encode_batch(self.tokenizer, self.recipe.data, examples, pad_to, self._to_device)

    def _to_device(self, *tensors: Any) -> list[Any]:
        """Host tensors to the device; under SPMD each host's batch becomes its slice of the global batch."""
        if self.mesh is None:
            return [t.to(self.device) for t in tensors]
        from tpuft.worker.torch_xla.sharding import batch_to_device

        return batch_to_device(self.mesh, self.device, tensors)

    # -- the loop's hooks: training ------------------------------------------------------------------------
    def start(self, step: int) -> int:
        """A resumed run puts zero-filled gradients in place, then every run seeds its RNGs (after the last
        sync before the first step: each sync moves the XLA seed on). The heartbeat says "starting" until the
        step's graph stops changing (XLA compiles each new one, which may take minutes): a fresh run's first
        step creates the optimizer state and the gradients inside its graph, so its second step compiles
        again; a resumed run has both in place from the start."""
        if self.checkpoint is not None:
            self._zero_grads()
        self._seed_rngs()
        return 1 if self.checkpoint is not None else 2

    def train_step(self, step: int) -> None:
        torch = self.torch
        train = self.recipe.train
        accum = train.grad_accum_steps
        micro = self.local_batch // accum
        fetched = time.time()
        examples = next(self.batches)
        self.loop.data_wait_s += time.time() - fetched  # the batch's wait, for the run's goodput events
        pieces = [self._encode(examples[i * micro : (i + 1) * micro]) for i in range(accum)]
        # The loss is summed over tokens and divided by the tokens of the whole step: accumulated
        # micro-batches give the update one batch of them all would.
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
        if self.replicas.world > 1 and step >= self.loop.warm_at:
            self.loop.beat(step, phase="collective")
        self.window.append(self.replicas.reduce_gradients(self.params, self.optimizer, extras))
        if train.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.params, train.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=False)
        self.torch_xla.sync()
        if self.loop.first_step_s is None:  # wait for the step itself: compilation and all, as a user waits
            self.window[-1].to("cpu")

    def progress(self) -> tuple[float, float, float]:
        stats = self.torch.stack([w.detach().to("cpu").float() for w in self.window])
        self.window = []
        tokens = float(stats[:, 1].sum()) * self.replicas.world
        return float(stats[:, 0].mean()), self.scheduler.get_last_lr()[0], tokens

    def _autocast(self) -> Any:
        """bf16 compute (``train.precision``): XLA's autocast, which on a TPU is what torch_xla.amp does and
        on the CPU pod runs the same bf16 casts on the CPU; weights, gradients and the optimizer stay
        float32."""
        return self.torch.autocast(
            "xla", dtype=self.torch.bfloat16, enabled=self.recipe.train.precision == "bf16"
        )

    def _logits(self, batch: Any) -> Any:
        from tpuft.worker.torch_xla import parts as torch_parts

        inputs = torch_parts.encoder_inputs(
            self.model, self._prompt_vectors(), batch.input_ids, batch.attention_mask
        )
        with self._autocast():
            return self.model(
                **inputs, decoder_input_ids=self.model._shift_right(batch.labels), use_cache=False
            ).logits

    def _prompt_vectors(self) -> Any:
        return None if self.prompt is None else self.prompt.weight

    def _loss_sum(self, batch: Any) -> Any:
        from tpuft.worker.torch_xla import parts as torch_parts

        return torch_parts.token_loss_sum(
            self._logits(batch), batch.labels, self.recipe.train.label_smoothing
        )

    def _seed_rngs(self) -> None:
        """Seed python's ``random``, torch's CPU generator and the XLA device RNG from (seed, replica, step):
        done at the start and after every checkpoint step, so that a run resumed from a checkpoint draws what
        the run uninterrupted drew, on every replica, with nothing saved (and each replica draws its own
        dropout masks). Every ``torch_xla.sync()`` moves the XLA seed on, so no sync may come between this and
        the next step."""
        import random

        import torch_xla.core.xla_model as xm

        seed = rng_seed(self.recipe.train.seed, self.replicas.rank, self.step)
        random.seed(seed)
        self.torch.manual_seed(seed)
        xm.set_rng_state(seed, str(self.device))

    def _zero_grads(self) -> None:
        """After its first step a run holds zero-filled gradients (``zero_grad(set_to_none=False)``) into
        which the next backward pass accumulates. A resumed run starts from the same, so that its first step
        computes with the same graph as the uninterrupted run's step there (and XLA compiles one step graph,
        not two)."""
        for param in self.params:
            param.grad = self.torch.zeros_like(param)
        self.torch_xla.sync()

    # -- the loop's hooks: evaluation -----------------------------------------------------------------------
    def evaluate(self) -> dict[str, Any]:
        return heldout.evaluate(self)

    def test(self, checkpoint: Path | None) -> dict[str, Any]:
        from tpuft.worker.torch_xla.testset import run_test

        return run_test(self, self.test_shard or [], checkpoint, PROMPT_FILE)

    def _trained_state(self) -> dict[str, Any]:
        """What the weight digest covers: the model, and the prompt when prompt tuning."""
        state = cpu_state(self.model)
        if self.prompt is not None:
            state["prompt.weight"] = self.prompt.weight.detach().to("cpu")
        return state

    # -- the loop's hooks: checkpoints and the end ----------------------------------------------------------
    def save(self, step: int) -> Path | None:
        """Worker 0 writes ``checkpoints/step_N`` (HF weights + optimizer + trainer state); then every replica
        reseeds where a run resumed from this checkpoint starts, to draw the same from here on."""
        state = {
            "examples_per_replica": step * self.local_batch,
            "data_position": self.batches.position(),
            "rng": "reseeded from (train.seed, replica, step) at this step",
        }
        path = self.loop.save_checkpoint(
            step,
            lambda folder: write_checkpoint(self, folder),
            backend="torch_xla",
            replicas=self.replicas.world,
            state=state,
        )
        if step < self.recipe.train.steps:
            self._seed_rngs()
        return path

    def agree(self, flag: bool) -> bool:
        """Any replica's ``flag``, on every replica (the time limit: every replica stops at the same step)."""
        return any_flag(self.replicas, self.torch, self.device, flag)

    def digest(self) -> str:
        digest = params_digest(self._trained_state())
        self._say(f"weights sha256 {digest[:16]} (replica {self.replicas.rank})", everyone=True)
        return digest

    def export(self, checkpoint: Path) -> None:
        out = export_hf(self.ctx, checkpoint, self.recipe.export.dtype)
        self._say(f"Hugging Face export: {out}")
        if self.prompt is not None:  # beside the HF dir: the frozen model plus this file is the tuned model
            shutil.copyfile(checkpoint / PROMPT_FILE, out.parent / PROMPT_FILE)
            self._say(f"soft prompt: {out.parent / PROMPT_FILE} ({self.prompt.weight.shape[0]} vectors)")
        heldout.show_samples(self, out, out.parent / PROMPT_FILE if self.prompt is not None else None)
