"""Benchmarks run as a node's worker runs: engine/platform/cpu.py's environment (on Linux,
the system OpenBLAS preloaded). Without it MLX's CPU matmuls are many times slower than a
node's, and a benchmark would measure the wrong thing."""

from __future__ import annotations

import os
import sys


def with_worker_blas(script: str) -> None:
    """Run `script` again under the worker's environment, unless already in it."""
    from engine.platform.cpu import worker_env

    env = worker_env()
    if env.get("LD_PRELOAD", "") != os.environ.get("LD_PRELOAD", ""):
        env.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
        os.execve(sys.executable, [sys.executable, script, *sys.argv[1:]], env)
