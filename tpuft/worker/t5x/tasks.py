"""The seqio task a T5X run trains on, registered from a plain spec (what ``run_dir/t5x/tasks.py`` passes in).

Two kinds, from the recipe's ``backend.task``:

* ``finetune``: text-to-text examples from data files or a Hugging Face dataset (``data.hf``), built by
  :func:`tpuft.data.make_example` as on every backend (the same fields, templates, prefix, transforms,
  preprocess hook and located errors; :mod:`tpuft.worker.t5x.data`), tokenized with the run's vocabulary, an
  input longer than its feature length cut as ``data.truncation`` says (:func:`keep_input_tokens`, before
  seqio trims at the end), EOS appended after trimming; metrics of the decoded predictions: exact match, and
  with ``eval.metric: bleu | rouge_l`` (or ``eval.generate_examples``) corpus BLEU and ROUGE-L, all scored by
  :mod:`tpuft.scoring.predictions`, the scorer of every backend's test evaluation.
* ``span_corruption``: T5's pretraining objective on plain text (one document a line, local or gs:// files):
  the documents' tokens are concatenated and cut into pieces of the length that, once ~``noise_density`` of
  them are replaced by one sentinel per span, fills the inputs length exactly; targets hold the masked spans,
  each after its sentinel. Written after T5's
  ``random_spans_helper``/``random_spans_noise_mask``/``noise_span_to_unique_sentinel`` (the ``t5`` package is
  not in the stack: it pins its own old TensorFlow), with stateless random ops seeded by seqio so that a run
  is reproducible.

Sentinels are the ids counted down from the top of the vocabulary (``vocab_size - 1`` is the first): for a
SentencePiece vocabulary with ``extra_ids`` those are ``<extra_id_0>``, ``<extra_id_1>``...; for ByT5 they are
the top byte values, as in its paper.
"""

from __future__ import annotations

import functools
from typing import Any

import seqio
import tensorflow as tf

from tpuft.scoring import predictions as scoring
from tpuft.worker.t5x.data import TEXT_METRICS

DEFAULT_VOCABULARIES = {
    "byt5": ("byt5", 0),
    "t5_1_0": ("gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model", 0),
    "t5_1_1": ("gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model", 0),
    "mt5": ("gs://t5-data/vocabs/mc4.250000.100extra/sentencepiece.model", 0),
    "umt5": ("gs://t5-data/vocabs/umt5.256000/sentencepiece.model", 300),
}
"""Each family's vocabulary as its t5x gin binds it: (SentencePiece model or 'byt5', extra_ids)."""


def vocabulary(spec: dict[str, Any]) -> seqio.Vocabulary:
    path, extra_ids = spec["vocabulary"], int(spec.get("extra_ids", 0))
    if path == "byt5":
        return seqio.ByteVocabulary(extra_ids=extra_ids)
    return seqio.SentencePieceVocabulary(path, extra_ids=extra_ids)


def random_spans_helper(
    inputs_length: int, noise_density: float, mean_noise_span_length: float
) -> tuple[int, int]:
    """(tokens per piece, targets length) such that a corrupted piece, with its sentinels and EOS, is exactly
    ``inputs_length`` long: T5's arithmetic (512 inputs at 0.15 / 3.0 -> 568 tokens, 114 targets)."""

    def lengths(tokens_length: int) -> tuple[int, int]:
        noise = int(round(tokens_length * noise_density))
        spans = int(round(noise / mean_noise_span_length))
        return tokens_length - noise + spans + 1, noise + spans + 1

    tokens_length = inputs_length - 1
    while lengths(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    _, targets_length = lengths(tokens_length)
    if noise_density == 0.5 and targets_length > inputs_length:
        tokens_length -= 1
        targets_length -= 1
    return tokens_length, targets_length


def random_spans_noise_mask(
    length: tf.Tensor, noise_density: float, mean_noise_span_length: float, seeds: Any
) -> tf.Tensor:
    """A boolean mask of ``length`` with about ``noise_density`` of it True, in spans of mean length
    ``mean_noise_span_length``, beginning with a non-noise span (T5's algorithm)."""
    orig_length = length
    length = tf.maximum(length, 2)
    num_noise_tokens = tf.cast(tf.round(tf.cast(length, tf.float32) * noise_density), tf.int32)
    num_noise_tokens = tf.minimum(tf.maximum(num_noise_tokens, 1), length - 1)
    num_noise_spans = tf.cast(
        tf.round(tf.cast(num_noise_tokens, tf.float32) / mean_noise_span_length), tf.int32
    )
    num_noise_spans = tf.maximum(num_noise_spans, 1)
    num_nonnoise_tokens = length - num_noise_tokens

    def segmentation(num_items: tf.Tensor, num_segments: tf.Tensor, seed: Any) -> tf.Tensor:
        first_in_segment = tf.pad(
            tf.random.experimental.stateless_shuffle(
                tf.cast(tf.range(num_items - 1) < num_segments - 1, tf.int32), seed
            ),
            [[1, 0]],
        )
        segment_id = tf.cumsum(first_in_segment)
        return tf.math.segment_sum(tf.ones_like(segment_id), segment_id)

    noise_span_lengths = segmentation(num_noise_tokens, num_noise_spans, seeds[0])
    nonnoise_span_lengths = segmentation(num_nonnoise_tokens, num_noise_spans, seeds[1])
    interleaved = tf.reshape(
        tf.stack([nonnoise_span_lengths, noise_span_lengths], axis=1), [num_noise_spans * 2]
    )
    span_starts = tf.cumsum(interleaved)[:-1]
    span_start_indicator = tf.math.unsorted_segment_sum(tf.ones_like(span_starts), span_starts, length)
    span_num = tf.cumsum(span_start_indicator)
    return tf.equal(span_num % 2, 1)[:orig_length]


def noise_span_to_unique_sentinel(tokens: tf.Tensor, noise_mask: tf.Tensor, vocab_size: int) -> tf.Tensor:
    """Each run of masked tokens becomes one sentinel id, counting down from ``vocab_size - 1``."""
    prev_is_noise = tf.pad(noise_mask[:-1], [[1, 0]])
    first_noise = tf.logical_and(noise_mask, tf.logical_not(prev_is_noise))
    subsequent_noise = tf.logical_and(noise_mask, prev_is_noise)
    sentinel = vocab_size - tf.cumsum(tf.cast(first_noise, tokens.dtype))
    tokens = tf.where(first_noise, sentinel, tokens)
    return tf.boolean_mask(tokens, tf.logical_not(subsequent_noise))


def span_corruption(
    dataset: tf.data.Dataset,
    *,
    tokens_length: int,
    vocab_size: int,
    noise_density: float,
    mean_noise_span_length: float,
) -> tf.data.Dataset:
    """Tokenized documents (``targets``) -> concatenated, cut into ``tokens_length`` pieces -> inputs with
    sentinels, targets with the masked spans."""
    pieces = dataset.map(_targets_of).unbatch().batch(tokens_length).map(_as_targets)

    @seqio.map_over_dataset(num_seeds=2)
    def denoise(features: dict[str, tf.Tensor], seeds: Any) -> dict[str, tf.Tensor]:
        tokens = features["targets"]
        mask = random_spans_noise_mask(tf.size(tokens), noise_density, mean_noise_span_length, seeds)
        return {
            "inputs": noise_span_to_unique_sentinel(tokens, mask, vocab_size),
            "targets": noise_span_to_unique_sentinel(tokens, tf.logical_not(mask), vocab_size),
        }

    return denoise(pieces)


def exact_match(targets: list[str], predictions: list[str]) -> dict[str, float]:
    """The share of predictions equal to their target (whitespace runs collapsed, the ends stripped: the test
    evaluation's :func:`tpuft.scoring.predictions.correct`), 0..1 like tpuft's other backends report it."""
    if not targets:
        return {"exact_match": 0.0}
    same = sum(scoring.correct(str(p), str(t)) for t, p in zip(targets, predictions))
    return {"exact_match": same / len(targets)}


def text_scores(targets: list[str], predictions: list[str]) -> dict[str, float]:
    """Corpus BLEU and mean ROUGE-L (0-100) of the decodes, by the one scorer of every backend
    (:func:`tpuft.scoring.predictions.score`)."""
    scores = scoring.score([str(p) for p in predictions], [str(t) for t in targets])
    return {name: float(scores[name]) for name in TEXT_METRICS}


def keep_input_tokens(
    dataset: tf.data.Dataset, sequence_length: dict[str, int] | None = None, *, mode: str
) -> tf.data.Dataset:
    """``data.truncation`` on the tokenized inputs, before ``append_eos_after_trim`` cuts them at the end: of
    an input longer than its feature length less one (EOS's room), keep the last tokens (``tail``) or the
    first and the last half (``head+tail``, the head getting the odd one), as
    :func:`tpuft.data.keep_tokens` does for the other backends. Without lengths (T5X's inference eval
    computes them from the longest input) nothing is cut."""
    if mode == "head" or not sequence_length or not sequence_length.get("inputs"):
        return dataset
    limit = int(sequence_length["inputs"]) - 1
    tail = limit if mode == "tail" else limit // 2

    @seqio.map_over_dataset
    def cut(features: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        ids = features["inputs"]
        size = tf.size(ids)
        last = ids[tf.maximum(size - tail, 0) :] if tail else ids[:0]
        kept = tf.concat([ids[: limit - tail], last], axis=0)
        return {**features, "inputs": tf.cond(size > limit, lambda: kept, lambda: ids)}

    return cut(dataset)


def without_autotune(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """``dataset`` with tf.data's autotuning model off, for the whole pipeline seqio and T5X build on it
    (options pass downstream).

    Why: in a T5X worker, dropping an iterator held the main thread in tf.data's teardown, waiting on a thread
    of its pool (gdb), for up to a minute; with the autotuning model off the wait is gone. T5X drops its
    evaluation iterators after every inference evaluation and its training iterator when its ``train``
    returns: each evaluation, and the test after the last step, started that much later while the hosts sat
    idle. The quickstart on the local pod (100 steps, 2026-11-29), from the last evaluation to the test: 24,
    27, 25, 37, 31 and 51 s with autotuning, 0.15 s twice without, with the same loss and throughput at every
    step (108.6 and 111.5 examples/s against 108.5). Without the model, the pipeline's ``AUTOTUNE``
    parallelism and buffers keep tf.data's defaults instead of sizes tuned to the host: enough for a text
    pipeline of short examples here; not measured on a TPU host.
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def _finetune_dataset(
    split: str, shuffle_files: bool, seed: int | None = None, *, data: dict[str, Any]
) -> tf.data.Dataset:
    from tpuft.worker.t5x.data import data_config, examples

    cfg = data_config({"data": data})

    def generate():  # type: ignore[no-untyped-def]
        for example in examples(cfg, split):
            yield {"inputs": example.source, "targets": example.target}

    signature = {"inputs": tf.TensorSpec([], tf.string), "targets": tf.TensorSpec([], tf.string)}
    return without_autotune(tf.data.Dataset.from_generator(generate, output_signature=signature))


def _has_text(line: tf.Tensor) -> tf.Tensor:
    return tf.strings.length(tf.strings.strip(line)) > 0


def _as_targets(text: tf.Tensor) -> dict[str, tf.Tensor]:
    return {"targets": text}


def _targets_of(example: dict[str, tf.Tensor]) -> tf.Tensor:
    return example["targets"]


def _corpus_dataset(
    split: str, shuffle_files: bool, seed: int | None = None, *, files: list[str]
) -> tf.data.Dataset:
    return without_autotune(tf.data.TextLineDataset(files).filter(_has_text).map(_as_targets))


def register(spec: dict[str, Any]) -> str:
    """Add the run's task to seqio's registry (replacing one of the same name) and return its name."""
    name = spec["name"]
    vocab = vocabulary(spec)
    if spec["task"] == "span_corruption":
        check_sentinels(vocab, spec)
        tokens_length, _ = random_spans_helper(
            spec["inputs_length"], spec["noise_density"], spec["mean_noise_span_length"]
        )
        source = seqio.FunctionDataSource(
            functools.partial(_corpus_dataset, files=list(spec["corpus"])),
            splits=("train",),
            caching_permitted=False,
        )
        preprocessors = [
            seqio.preprocessors.tokenize,
            functools.partial(
                span_corruption,
                tokens_length=tokens_length,
                vocab_size=vocab.vocab_size,
                noise_density=spec["noise_density"],
                mean_noise_span_length=spec["mean_noise_span_length"],
            ),
            seqio.preprocessors.append_eos_after_trim,
        ]
        metric_fns: list[Any] = []
    else:
        from tpuft.worker.t5x.data import data_config, split_names

        cfg = data_config(spec)
        source = seqio.FunctionDataSource(
            functools.partial(_finetune_dataset, data=spec["data"]),
            splits=tuple(split_names(cfg)),
            caching_permitted=False,
        )
        preprocessors = [
            seqio.preprocessors.tokenize,
            functools.partial(keep_input_tokens, mode=cfg.truncation),
            seqio.preprocessors.append_eos_after_trim,
        ]
        metric_fns = [exact_match, text_scores] if spec.get("text_metrics") else [exact_match]
    features = {
        "inputs": seqio.Feature(vocabulary=vocab, add_eos=True, required=False),
        "targets": seqio.Feature(vocabulary=vocab, add_eos=True),
    }
    if name in seqio.TaskRegistry.names():
        seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(
        name, source=source, preprocessors=preprocessors, output_features=features, metric_fns=metric_fns
    )
    return name


def check_sentinels(vocab: seqio.Vocabulary, spec: dict[str, Any]) -> None:
    """A SentencePiece vocabulary whose top ids are ordinary pieces would have them overwritten by
    sentinels."""
    if isinstance(vocab, seqio.ByteVocabulary) or int(spec.get("extra_ids", 0)) > 0:
        return
    top = vocab.tokenizer.id_to_piece(vocab.vocab_size - 1) if hasattr(vocab, "tokenizer") else ""
    if "extra_id" not in top:
        from tpuft.core.errors import UsageError

        raise UsageError(
            f"{spec['vocabulary']}: span corruption needs sentinel ids, and the top id of this SentencePiece "
            f"vocabulary is the ordinary piece {top!r}: set backend.extra_ids (T5 used 100)"
        )
