"""Local stand-ins for the machines and services tpuft drives (an sshd pod, a fake Cloud TPU API)."""
