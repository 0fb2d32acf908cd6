"""Benchmarks that load a model in their own process run it as a worker would."""

from __future__ import annotations

import os
import sys


def as_a_worker_runs() -> None:
    """Re-run this script with the environment a worker process gets (OpenBLAS preloaded
    on Linux: without it a pass of 7 tokens costs 6x one token on this CPU instead of
    1.3x, and a 256-token prompt chunk ~100x a plain one)."""
    from engine.platform.cpu import worker_env
    env = worker_env()
    if env.get("LD_PRELOAD", "") != os.environ.get("LD_PRELOAD", ""):
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
