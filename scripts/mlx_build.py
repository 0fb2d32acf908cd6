#!/usr/bin/env python3
"""Which MLX build scripts/setup installs on Linux: prints `cpu`, `cuda12` or `cuda13` (the
pip extra of `mlx`), and why on stderr. Standard library only: it runs before the virtual
environment exists.

CUDA where an NVIDIA driver answers and SHOAL_MLX isn't `cpu`; CUDA 13 where the driver can
run it (580 or newer) and the card is one CUDA 13 still builds for (compute capability 7.5,
Turing, or newer); CUDA 12 where the driver is 525 or newer; the CPU build otherwise.
SHOAL_MLX=cpu|cuda12|cuda13 forces the choice.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys

QUERY = ["nvidia-smi", "--query-gpu=driver_version,compute_cap", "--format=csv"]
CUDA13_DRIVER = 580  # CUDA 13.0 needs driver 580.65.06 or newer (CUDA release notes)
CUDA12_DRIVER = 525  # CUDA 12.0 needs 525.60.13 or newer
CUDA13_MIN_CAP = (7, 5)  # CUDA 13 dropped Maxwell, Pascal and Volta


def choose(smi_csv: str | None, forced: str | None = None) -> tuple[str, str]:
    """(build, reason) from `nvidia-smi --query-gpu=driver_version,compute_cap
    --format=csv` output (None: no nvidia-smi, or it failed) and SHOAL_MLX."""
    if forced in ("cpu", "cuda12", "cuda13"):
        return forced, f"SHOAL_MLX={forced}"
    if forced:
        return "cpu", f"SHOAL_MLX={forced!r} is not cpu, cuda12 or cuda13: the CPU build"
    if smi_csv is None:
        return "cpu", "no NVIDIA driver answered (nvidia-smi): the CPU build"
    rows = [r for r in csv.reader(smi_csv.splitlines()[:65], skipinitialspace=True) if r]
    head = [re.sub(r"\s*\[.*\]$", "", c.strip()) for c in rows[0]] if rows else []
    if "driver_version" not in head:
        return "cpu", "nvidia-smi didn't give its driver version: the CPU build"
    cells = dict(zip(head, rows[1], strict=False)) if len(rows) > 1 else {}
    driver = re.match(r"(\d+)\.", cells.get("driver_version", "").strip())
    cap = re.fullmatch(r"(\d+)\.(\d+)", cells.get("compute_cap", "").strip())
    if not driver:
        return "cpu", "nvidia-smi listed no GPU with a driver version: the CPU build"
    return by_driver(int(driver.group(1)), (int(cap[1]), int(cap[2])) if cap else None)


def by_driver(major: int, cap: tuple[int, int] | None) -> tuple[str, str]:
    """The build for a driver's major version and the first card's compute capability."""
    if major >= CUDA13_DRIVER and (cap is None or cap >= CUDA13_MIN_CAP):
        return "cuda13", f"NVIDIA driver {major} runs CUDA 13"
    if major >= CUDA12_DRIVER:
        why = f"compute capability {cap[0]}.{cap[1]} is older than CUDA 13 supports" \
            if cap and cap < CUDA13_MIN_CAP else f"driver {major} predates CUDA 13 (580)"
        return "cuda12", f"NVIDIA driver {major}: CUDA 12 ({why})"
    return "cpu", (f"NVIDIA driver {major} is too old for MLX's CUDA build (525 or newer "
                   f"runs CUDA 12): the CPU build; update the driver to use the GPU")


def query() -> str | None:
    """nvidia-smi's answer, bounded in time; None where there is none."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        p = subprocess.run([exe, *QUERY[1:]], capture_output=True, text=True, timeout=10,
                           stdin=subprocess.DEVNULL, errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


def main() -> int:
    build, why = choose(query(), os.environ.get("SHOAL_MLX") or None)
    print(build)
    print(f"MLX build: {build} ({why})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
