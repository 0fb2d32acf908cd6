"""Shoal engine: node."""
