"""The run directory and its records, as the workers that write them and the controller that reads them
share them: the contract's names (``rundir``), the goodput timeline, cost, maintenance windows and the
checkpoint asked before one, start-up (which trainers are not up yet), and a predict job with its parts.
"""
