"""Shoal engine: placement."""
