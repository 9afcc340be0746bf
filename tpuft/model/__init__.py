"""Model shapes and summaries: the T5 config schema, parameter and memory counts, the T5X gin's network, FSDP
plans."""
