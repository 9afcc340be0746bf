"""The controller's readers of a run: find and snapshot runs, monitor, plots, TensorBoard events."""
