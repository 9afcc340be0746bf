"""Foundations: errors, paths, name and path formats, bounded YAML, checked types, cluster records, ports,
waits, the TPU catalogue."""
