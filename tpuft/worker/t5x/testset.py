"""T5X's test evaluation (``data.test``) at the end of a fine-tuning run: the checkpoint every backend tests
and ``tpuft predict RUN`` takes (the best by the inference eval's exact match under ``train.keep_best``, else
the last) decodes every test example with T5X's own decoding
(:class:`tpuft.worker.t5x.decode.T5xDecoder`, the ``tpuft predict`` engine's too), every process its share
(example ``i`` of ``data.test`` or of ``data.hf.test_split`` goes to process ``i % processes``, as
:func:`tpuft.worker.hf_data.held_out` deals it for every backend) in lock-step; the shares are scored with
:mod:`tpuft.scoring.predictions`, their statistics summed over the processes, and written to
``run_dir/test/``.

Once per run, also after a resume. T5X writes its checkpoints itself, not through ``RunLoop.save_checkpoint``,
and the test runs after the last one is written, so the result cannot ride in a checkpoint's
``trainer_state.json`` as it does for the other backends. Its record is the run's ``metrics.jsonl`` instead:
the test row is logged at the final step, which a resume keeps (it forgets only the rows after the checkpoint
it resumes from, and a test means the final checkpoint exists), and the trainer reads it back at start-up
(``T5xRun._resume``). Host 0 is the one that has ``metrics.jsonl`` on a slice, so it decides for every host
(:func:`agree`): all of them test, or none.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuft.data import Example
from tpuft.scoring import predictions
from tpuft.worker.hf_data import has_held_out, held_out

if TYPE_CHECKING:
    from tpuft.config import RecipeConfig
    from tpuft.worker.loop import RunLoop


def agree(values: Sequence[int]) -> list[int]:
    """Host 0's ``values`` on every host (one collective; every host calls it)."""
    import jax

    if jax.process_count() == 1:
        return list(values)
    import numpy as np
    from jax.experimental import multihost_utils

    return [int(v) for v in np.asarray(multihost_utils.broadcast_one_to_all(np.asarray(values, np.int64)))]


def gathered(values: Sequence[float]) -> list[list[float]]:
    """Every process's ``values`` (the same length on each), in process order (one collective; every process
    calls it)."""
    import jax

    if jax.process_count() == 1:
        return [list(values)]
    import numpy as np
    from jax.experimental import multihost_utils

    stacked = np.asarray(multihost_utils.process_allgather(np.asarray(values, np.float64)))
    return stacked.reshape(jax.process_count(), -1).tolist()


def evaluate(
    decoder: Any, examples: list[tuple[int, Example]], out: Path, labels: Sequence[str] = ()
) -> dict[str, Any]:
    """Decode ``examples`` in ``decoder.batch_size`` batches, as many calls on every process (the longest
    share's count), write them to ``out``, and return the scores summed over every process."""
    import jax

    calls = int(max(row[0] for row in gathered([-(-len(examples) // decoder.batch_size)])))
    sources, targets, decoded = [e.source for _, e in examples], [e.target for _, e in examples], []
    for call in range(calls):
        decoded += decoder.predict(sources[call * decoder.batch_size : (call + 1) * decoder.batch_size])
    with predictions.PredictionWriter(out / predictions.shard_name(jax.process_index())) as writer:
        for (index, _), source, target, prediction in zip(examples, sources, targets, decoded):
            writer.write(predictions.row(index, source, prediction, target))
    stats = gathered(predictions.statistics(decoded, targets, labels))
    return predictions.scores([sum(column) for column in zip(*stats)], labels)


def test_checkpoint(loop: RunLoop, recipe: RecipeConfig, gin_file: Path, checkpoint: str) -> dict[str, Any]:
    """The test scores of the T5X ``checkpoint`` folder (local or gs://), with the model the run gin builds:
    decoded, scored, this process's share written (every process; the sequencer records the row)."""
    import jax

    from tpuft.worker.t5x.decode import T5xDecoder, model_and_partitioner, parse_run_gin

    assert has_held_out(recipe.data, "test")
    parse_run_gin(gin_file)  # anew: t5x.train's __main__, which the run gin imports, has gone with it
    model, partitioner = model_and_partitioner()
    processes = jax.process_count()
    decoder = T5xDecoder(
        model,
        partitioner,
        checkpoint,
        batch_size=-(-recipe.eval.batch_size // processes),
        inputs_length=recipe.data.max_source_length,
        decode_length=recipe.data.max_target_length,
        truncation=recipe.data.truncation,
    )
    examples = held_out(recipe.data, "test", rank=jax.process_index(), world=processes)
    result = evaluate(decoder, examples, loop.test_predictions_dir())
    decoder.close()
    return result
