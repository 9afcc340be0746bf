"""`tpuft predict` on a worker: the shard loop, the join and the Hugging Face engine."""
