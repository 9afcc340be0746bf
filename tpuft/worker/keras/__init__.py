"""The Keras engine's worker code: transformers' TF models under a TPUStrategy, driven by model.fit."""
