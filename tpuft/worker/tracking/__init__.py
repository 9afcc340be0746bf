"""The trackers' sidecar (W&B, MLflow) on the chief, in its own venv."""
