"""What computes on this machine: MLX's backend (Metal, CUDA or the CPU), what it says about
its device, and the GPUs the OS names. mlx is imported inside functions: the GUI reads this
without it."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def metal_working_set() -> int | None:
    info = mlx_device_info("metal")
    v = info.get("max_recommended_working_set_size") if info else None
    return int(v) if isinstance(v, (int, float)) and v > 0 else None


def mlx_device_info(backend: str) -> dict[str, Any] | None:
    try:
        import mlx.core as mx
        if backend == "metal" and not mx.metal.is_available():
            return None
        # mx.device_info() is the newer name; mx.metal.device_info() the older one.
        fn = getattr(mx, "device_info", None) or mx.metal.device_info
        return dict(fn())
    except Exception as e:  # mlx missing or broken: a fact to report, not a crash
        log.debug("mlx device info unavailable: %s", e)
        return None


def mlx_backend() -> tuple[str | None, str | None]:
    """(mlx version, backend): metal, cuda or cpu; (None, None) when mlx can't load."""
    try:
        import mlx.core as mx
    except Exception as e:
        log.warning("mlx can't be imported: %s", e)
        return None, None
    version = getattr(mx, "__version__", None)
    if mx.metal.is_available():
        return version, "metal"
    cuda = getattr(mx, "cuda", None)
    if cuda is not None and cuda.is_available():
        return version, "cuda"
    return version, "cpu"


def mac_gpu_name(profiler_json: str) -> str | None:
    """`system_profiler SPDisplaysDataType -json` → "Apple M3 Ultra (80-core GPU)"."""
    import json
    try:
        gpus = json.loads(profiler_json).get("SPDisplaysDataType") or []
        g = next(x for x in gpus if isinstance(x, dict) and x.get("sppci_model"))
    except (ValueError, AttributeError, StopIteration):
        return None
    cores = g.get("sppci_cores")
    return f"{g['sppci_model']} ({cores}-core GPU)" if cores else str(g["sppci_model"])


def nvidia_gpu_names(root: Path = Path("/proc/driver/nvidia/gpus")) -> list[str]:
    names = []
    for info in sorted(root.glob("*/information")):
        m = re.search(r"^Model:\s*(.+)$", info.read_text(errors="replace"), re.M)
        if m:
            names.append(m.group(1).strip())
    return names
