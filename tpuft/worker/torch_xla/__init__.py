"""The PyTorch/XLA engine's worker code: PJRT, FSDP or replicas, tpuft's own loop."""
