"""Shoal engine: cluster."""
