"""The supervisor's command line as the controller calls it: the module it runs (``python -m ...``), the exit
codes of its subcommands and the marker ``follow`` prints first.

The supervisor itself is on the worker side (:mod:`tpuft.worker.supervisor.process`); these names are the
contract between it and :mod:`tpuft.ops.lifecycle`, so they live where both import them, and the controller
never imports the supervisor.
"""

from __future__ import annotations

MODULE = "tpuft.worker.supervisor.process"
"""The supervisor's module, run by name on the worker (``python -m``): a string, not an import."""
BUSY_EXIT = 4
"""``check`` / ``start``: the worker is busy with another live run."""
NO_RUN_EXIT = 3
"""``follow`` / ``stop``: this worker has no such run."""
FROM_LINE_MARKER = "__TPUFT_FROM_LINE__"
"""``follow`` first prints the index of the first log line it sends, so that a re-attach continues exactly."""
