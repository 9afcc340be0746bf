"""Checkpoints -> Hugging Face model directories (config.json + safetensors + tokenizer files).

Framework-free on purpose: it runs in the CLI (which never imports torch) and on workers alike.
"""
