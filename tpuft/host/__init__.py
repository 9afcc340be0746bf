"""A worker host as the controller and the worker both know it, outside the run directory: the stdlib scripts
the controller ships and runs there with the host's base python (``bootstrap``, ``doctor_probe``), the host's
own state (``state``: the supervisor's folder, the TPU device files, its processes), the supervisor's command
line (``supervisor_cli``) and the launch variables the worker reads by name (``launch_env``).

Shared by ``ops`` (which starts, probes and cleans hosts) and ``worker`` (which runs on them), so neither side
imports the other for them; this package imports only the foundations.
"""
