"""Shoal's desktop app (PySide6). Talks to the local node only through engine.client."""
