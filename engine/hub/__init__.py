"""Shoal engine: hub."""
