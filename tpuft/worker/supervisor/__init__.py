"""The per-host supervisor: starts the trainer, watches its peers, relays stops, checkpoint asks and
maintenance."""
