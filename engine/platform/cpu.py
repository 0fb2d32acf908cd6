"""Making MLX's CPU path as fast as it can be on Linux.

The mlx-cpu wheel bundles the reference (netlib) BLAS, which makes prefill matmuls slow.
A worker started with the system's OpenBLAS preloaded resolves its cblas_* symbols there
instead, and products of one to four rows (decode steps) go to its gemv on the way
(gemv.py). Measured numbers are in docs/benchmarks.md.
"""

from __future__ import annotations

import glob
import os
import sys

from engine.platform import gemv

# Debian/Ubuntu multiarch paths first; the pthread variant avoids OpenMP thread pools
# fighting MLX's own threads.
_OPENBLAS_CANDIDATES = (
    "/usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/*-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)


def system_openblas() -> str | None:
    """Path of a system OpenBLAS library, or None."""
    for pattern in _OPENBLAS_CANDIDATES:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    return None


def worker_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a worker process. SHOAL_OPENBLAS=0 turns the preload off,
    SHOAL_GEMV=0 only the gemv shim in front of it."""
    env = dict(os.environ if base is None else base)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if sys.platform != "linux" or env.get("SHOAL_OPENBLAS") == "0":
        return env
    lib = system_openblas()
    if lib and lib not in env.get("LD_PRELOAD", ""):
        shim = gemv.shim() if env.get("SHOAL_GEMV") != "0" else None
        if shim:
            env.setdefault("SHOAL_GEMV_CACHE_BYTES", str(gemv.last_level_cache_bytes()))
        env["LD_PRELOAD"] = ":".join(p for p in (shim, lib, env.get("LD_PRELOAD", "")) if p)
        # One BLAS thread per core is OpenBLAS's default; MLX runs its own pool beside it.
        env.setdefault("OPENBLAS_NUM_THREADS", str(os.cpu_count() or 1))
    return env


def available_memory_bytes() -> int | None:
    """MemAvailable on Linux (what can be used without swapping); None elsewhere."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def should_dequantize(fp32_bytes: int, on_gpu: bool, setting: str | None = None,
                      available: int | None = None) -> bool:
    """On the CPU, MLX's quantized matmul is a plain loop (about 1 GFLOP/s here) while
    float32 matmuls go through BLAS: unpacking the weights once at load time is exact and
    several times faster, when the float32 copy fits comfortably in memory.
    SHOAL_CPU_DEQUANTIZE=0/1 forces the choice; the default is auto."""
    setting = setting if setting is not None else os.environ.get("SHOAL_CPU_DEQUANTIZE", "auto")
    if setting in ("0", "1"):
        return setting == "1"
    if on_gpu:
        return False
    return available is not None and fp32_bytes <= available // 2
