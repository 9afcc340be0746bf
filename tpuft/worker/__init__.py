"""Code that runs ON a worker host, inside the backend's venv.

Shipped alone to TPU hosts, so it imports nothing from the CLI side (cli, ops, providers, fleet): only
``tpuft.config`` (with what it reads recipes with: ``safe_yaml``, ``formats``, ``t5_config``, ``templates``),
``tpuft.core.errors``, ``tpuft.run.rundir``, ``tpuft.storage`` (a run dir in a bucket), ``tpuft.convert``, the
stdlib and the backend's own libraries.
``tests/worker/test_data.py`` checks the import closure.
"""
