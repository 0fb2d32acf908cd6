"""Shoal engine: runtime."""
