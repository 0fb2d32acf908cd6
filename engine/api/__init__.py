"""Shoal engine: api."""
