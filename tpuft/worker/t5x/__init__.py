"""The T5X engine's worker code: gin and seqio, T5X's own train loop with tpuft's hooks."""
