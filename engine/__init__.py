"""Shoal's engine: node daemon, workers, cluster, placement, hub. Never imports Qt."""

__version__ = "0.1.0"
