"""The run directory and its records: the contract's names, the goodput timeline, cost, maintenance
windows."""
