"""Helpers for packaging/build and packaging/shoal.spec: bundle metadata, icons, the Linux
archive. Standard library only (plus Qt for drawing icons), so they run on any build host."""
