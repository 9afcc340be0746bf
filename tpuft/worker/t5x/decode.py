"""T5X's own decoding of a trained T5X checkpoint on the run's mesh: the one predict function behind the test
evaluation that ends a run (:mod:`tpuft.worker.t5x.testset`) and the ``tpuft predict`` engine
(:mod:`tpuft.worker.t5x.predict`).

What T5X's ``infer`` does, cut to what tpuft needs: the model and partitioner the run gin builds, the train
state restored from ``checkpoint_N`` without the optimizer (T5X's ``TrainStateInitializer`` with
``optimizer_def=None``, ``RestoreCheckpointConfig(mode='specific', strict=False)``, local or gs://), and
``model.predict_batch_with_aux`` (beam search with ``num_decodes`` beams; one beam is T5X's greedy decoding,
the inference eval's) partitioned over the mesh, its output replicated.

Lock-step (SPMD): every process calls :meth:`T5xDecoder.predict` the same number of times. Each call gathers
every process's tokenized inputs (``process_allgather``: a few KB of ids), so each host holds the whole global
batch and gives the devices whatever shards the mesh assigns them (``make_array_from_callback``): no
assumption about which host feeds which replica, which on a slice where a model partition spans hosts is not
the host's own. The global batch is the processes' batches end to end, padded to a multiple of the mesh's
``data`` axis; process ``p``'s rows are ``p * batch_size ..``. A step whose global batch is all padding is not
run.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tpuft.core.errors import TpuftError


@contextlib.contextmanager
def t5x_train_as_main() -> Iterator[None]:
    """The run gin says ``import __main__ as train_script`` (``t5x.train`` runs as ``__main__`` in a
    training): while it is parsed outside a training, ``__main__`` is ``t5x.train``."""
    import t5x.train as train_script

    saved = sys.modules["__main__"]
    sys.modules["__main__"] = train_script
    try:
        yield
    finally:
        sys.modules["__main__"] = saved


def parse_run_gin(gin_file: Path) -> None:
    """The run gin parsed as ``t5x.train`` parses it (T5X's configs on the search path)."""
    import os

    import gin
    import t5x
    from t5x import gin_utils

    gin.clear_config()
    with t5x_train_as_main():
        gin_utils.parse_gin_flags(
            gin_search_paths=[os.path.dirname(os.path.dirname(t5x.__file__))],
            gin_files=[str(gin_file)],
            gin_bindings=[],
        )


def model_and_partitioner() -> tuple[Any, Any]:
    """The model (``%MODEL``) and the partitioner (``train.partitioner``) of the parsed run gin: the network,
    the vocabularies, the decoding function and the mesh of the training."""
    import gin

    model = gin.query_parameter("%MODEL").scoped_configurable_fn()
    partitioner = gin.query_parameter("train_script.train.partitioner").scoped_configurable_fn()
    return model, partitioner


def _not_restoring(record: logging.LogRecord) -> bool:
    return "Not restoring param" not in record.getMessage()


class T5xDecoder:
    """A checkpoint's weights on the mesh and a compiled decode step for a static global batch.

    ``batch_size`` is this process's examples per call (the same on every process); ``inputs_length`` is the
    encoder's length (longer inputs are cut as ``truncation`` says, ``data.truncation``, EOS kept, as the
    run's seqio task cuts them); ``decode_length`` the most tokens a prediction has, EOS included (T5X's
    targets length)."""

    def __init__(
        self,
        model: Any,
        partitioner: Any,
        checkpoint: str,
        *,
        batch_size: int,
        inputs_length: int,
        decode_length: int,
        num_beams: int = 1,
        truncation: str = "head",
    ) -> None:
        import jax
        import numpy as np
        from jax.sharding import NamedSharding
        from t5x import utils

        self.model = model
        self.vocabulary = model.input_vocabulary
        self.output_vocabulary = model.output_vocabulary
        self.batch_size = batch_size
        self.inputs_length = inputs_length
        self.decode_length = decode_length
        self.truncation = truncation
        self.processes = jax.process_count()
        self.process = jax.process_index()
        replicas = int(partitioner.mesh.shape.get("data", 1))
        self.global_batch = -(-self.processes * batch_size // replicas) * replicas
        shapes = {
            "encoder_input_tokens": (self.global_batch, inputs_length),
            "decoder_input_tokens": (self.global_batch, decode_length),
        }
        initializer = utils.TrainStateInitializer(
            optimizer_def=None,
            init_fn=model.get_initial_variables,
            input_shapes=shapes,
            input_types={name: np.int32 for name in shapes},
            partitioner=partitioner,
        )
        # Without an optimizer, T5X warns once per optimizer-state array it leaves behind: noise in a worker's
        # log.
        logging.getLogger("absl").addFilter(_not_restoring)
        restore = utils.RestoreCheckpointConfig(
            path=checkpoint, mode="specific", strict=False, dtype="float32"
        )
        state, _ = utils.create_checkpoint_manager_and_restore(
            initializer, partitioner, restore, checkpoint, None, use_orbax=True
        )
        if state is None:
            raise TpuftError(f"{checkpoint}: no T5X checkpoint to restore there")
        self.params = state.params
        self.sharding = NamedSharding(partitioner.mesh, partitioner.data_partition_spec)

        def decode(params: Any, batch: dict[str, Any]) -> Any:
            decodes, _ = model.predict_batch_with_aux(params, batch, num_decodes=num_beams)
            return decodes

        axes = initializer.train_state_axes
        self._step = partitioner.partition(
            decode, in_axis_resources=(axes.params, partitioner.data_partition_spec), out_axis_resources=None
        )

    def tokens(self, sources: Sequence[str]) -> Any:
        """``[batch_size, inputs_length]`` ids: each source encoded, cut to leave room for EOS, EOS,
        0-padded."""
        import numpy as np

        from tpuft.data import keep_tokens

        if len(sources) > self.batch_size:
            raise ValueError(f"{len(sources)} inputs for a batch of {self.batch_size}")
        ids = np.zeros((self.batch_size, self.inputs_length), np.int32)
        eos = self.vocabulary.eos_id
        for row, text in enumerate(sources):
            encoded = keep_tokens(
                list(self.vocabulary.encode(text)), self.inputs_length - 1, self.truncation
            ) + [eos]
            ids[row, : len(encoded)] = encoded
        return ids

    def predict(self, sources: Sequence[str]) -> list[str]:
        """This process's decodes of ``sources`` (at most ``batch_size``); every process calls it together."""
        import jax
        import numpy as np
        from jax.experimental import multihost_utils

        local = self.tokens(sources)
        gathered = multihost_utils.process_allgather(local, tiled=True) if self.processes > 1 else local
        inputs = np.zeros((self.global_batch, self.inputs_length), np.int32)
        inputs[: gathered.shape[0]] = np.asarray(gathered).reshape(-1, self.inputs_length)
        if not inputs.any():  # every process is out of inputs: the same answer on every process, no step
            return []
        batch = {
            "encoder_input_tokens": inputs,
            "decoder_input_tokens": np.zeros((self.global_batch, self.decode_length), np.int32),
        }
        arrays = {
            name: jax.make_array_from_callback(value.shape, self.sharding, lambda index, v=value: v[index])
            for name, value in batch.items()
        }
        decodes = self._step(self.params, arrays)
        if decodes.is_fully_replicated:  # as asked: every host holds every decode
            every = np.asarray(decodes.addressable_data(0))
        else:
            every = np.asarray(multihost_utils.process_allgather(decodes, tiled=True))
        mine = every[self.process * self.batch_size :][: len(sources)]
        return [self.output_vocabulary.decode(row.tolist()) for row in mine]

    def close(self) -> None:
        self.params = None
