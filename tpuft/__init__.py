"""tpuft: T5-family fine-tuning on Cloud TPU VMs, end to end.

The package is split the way data flows (see docs/ARCHITECTURE.md): ``config`` and ``accelerators`` describe
what to run, ``ops`` are the verbs, ``providers``/``fleet``/``backends``/``storage`` are the places they
reach, and ``worker`` is what runs on each TPU host inside the backend's own venv.
"""

__version__ = "0.1.0"
