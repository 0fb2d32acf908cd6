"""Shoal engine: telemetry."""
