"""Prompt tuning for the Keras trainer (``model.prompt_tuning``, Lester et al., 2021): ``tokens`` trainable
vectors put before every input's embeddings, the whole T5 frozen; the Keras form of
``torch_parts.SoftPrompt``.

HF's TF T5 takes ``inputs_embeds`` in its encoder, so the prompt is prepended inside the training graph: the
token embeddings of the input (the model's own ``shared`` table) with the prompt's vectors in front, and the
attention mask widened by as many ones, for the encoder and for the decoder's cross-attention.
:class:`PromptedT5` wraps the HF model behind the calls the trainer's steps (``keras_parts``) and the
prediction engine (``keras_predict``) make of it, so they need not know: ``trainable_variables`` is the prompt
alone (what the train step differentiates and the optimizer updates), ``weights`` the model's and the prompt
(the digest, the test's weight swap), ``save_pretrained`` writes the HF model and ``prompt.safetensors`` (key
``prompt``, ``[tokens, d_model]`` float32: the torch trainer's file, so the frozen model plus this file is the
tuned model for either). TensorFlow is passed in: this module imports without it.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from tpuft.core.errors import UsageError

PROMPT_FILE = "prompt.safetensors"
"""The soft prompt in a checkpoint and beside the Hugging Face export (the torch trainer's name and
format)."""
VOCAB_INIT_TOKENS = 5000
"""``init: vocab`` draws from the first (most frequent, for sentencepiece vocabularies) ids, as the torch
trainer."""


class PromptedT5:
    """A ``TFT5ForConditionalGeneration`` with a soft prompt before its encoder's input. Built in the
    strategy's scope (the prompt is a variable of the strategy: mirrored over the replicas, all-reduced like
    any weight)."""

    def __init__(
        self, tf: Any, inner: Any, *, tokens: int, init: str, seed: int, checkpoint: Path | None
    ) -> None:
        self.tf, self.inner = tf, inner
        # the weights exist: the vocab init reads the embedding table
        inner(inner.dummy_inputs, training=False)
        inner.trainable = False  # frozen: only the prompt learns
        table = inner.get_input_embeddings().weights[0].numpy()
        start = initial_prompt(table, tokens, init, seed)
        if checkpoint is not None and (checkpoint / PROMPT_FILE).is_file():
            start = load_prompt(checkpoint / PROMPT_FILE)
        self.prompt = tf.Variable(start, trainable=True, name="soft_prompt", dtype=tf.float32)

    # -- what the trainer and the engine use of an HF model -------------------------------------------------
    @property
    def config(self) -> Any:
        return self.inner.config

    @property
    def trainable_variables(self) -> list[Any]:
        return [self.prompt]

    @property
    def weights(self) -> list[Any]:
        return [*self.inner.weights, self.prompt]

    def __call__(
        self,
        input_ids: Any = None,
        attention_mask: Any = None,
        decoder_input_ids: Any = None,
        encoder_outputs: Any = None,
        training: bool = False,
    ) -> Any:
        mask = self._mask(attention_mask)
        if (
            encoder_outputs is not None
        ):  # the encoder ran already (with the prompt): its mask is the widened one
            return self.inner(
                input_ids=None,
                encoder_outputs=encoder_outputs,
                attention_mask=mask,
                decoder_input_ids=decoder_input_ids,
                training=training,
            )
        return self.inner(
            input_ids=None,
            inputs_embeds=self._embeds(input_ids),
            attention_mask=mask,
            decoder_input_ids=decoder_input_ids,
            training=training,
        )

    def get_encoder(self) -> Any:
        encoder = self.inner.get_encoder()

        def encode(input_ids: Any, attention_mask: Any, training: bool = False) -> Any:
            return encoder(
                input_ids=None,
                inputs_embeds=self._embeds(input_ids),
                attention_mask=self._mask(attention_mask),
                training=training,
            )

        return encode

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        raise UsageError(
            "beam search (num_beams > 1) of a prompt-tuned Keras model is not supported: transformers' "
            "TF generate cannot take the soft prompt; decode greedily (num_beams 1)"
        )

    def save_pretrained(self, folder: Path) -> None:
        from safetensors.numpy import save_file

        self.inner.save_pretrained(folder)
        save_file({"prompt": self.prompt.numpy()}, str(Path(folder) / PROMPT_FILE))

    def load_prompt(self, folder: Path) -> None:
        self.prompt.assign(load_prompt(Path(folder) / PROMPT_FILE))

    # -- the prompt in front --------------------------------------------------------------------------------
    def _embeds(self, input_ids: Any) -> Any:
        tf = self.tf
        embeds = self.inner.get_input_embeddings()(input_ids)
        vectors = tf.cast(self.prompt, embeds.dtype)[None]
        return tf.concat([tf.tile(vectors, [tf.shape(embeds)[0], 1, 1]), embeds], axis=1)

    def _mask(self, mask: Any) -> Any:
        tf = self.tf
        ones = tf.ones([tf.shape(mask)[0], self.prompt.shape[0]], mask.dtype)
        return tf.concat([ones, mask], axis=1)


def initial_prompt(table: Any, tokens: int, init: str, seed: int) -> Any:
    """The prompt's start: the embeddings of ``tokens`` random vocabulary ids (``vocab``, drawn as the torch
    trainer draws them), or uniform in [-0.5, 0.5) (``random``)."""
    import numpy as np

    if init == "vocab":
        rng = random.Random(seed)
        ids = [rng.randrange(min(VOCAB_INIT_TOKENS, table.shape[0])) for _ in range(tokens)]
        return np.asarray(table[ids], np.float32)
    return np.random.default_rng(seed).uniform(-0.5, 0.5, (tokens, table.shape[1])).astype(np.float32)


def load_prompt(path: Path) -> Any:
    from safetensors.numpy import load_file

    return load_file(str(path))["prompt"]


def wrap(tf: Any, hf: Any, recipe: Any, checkpoint: Path | None) -> Any:
    """``hf`` with the recipe's soft prompt (``checkpoint``'s when it has one), or ``hf`` itself without
    prompt tuning."""
    tuning = recipe.model.prompt_tuning
    if tuning is None:
        return hf
    return PromptedT5(
        tf, hf, tokens=tuning.tokens, init=tuning.init, seed=recipe.train.seed, checkpoint=checkpoint
    )
