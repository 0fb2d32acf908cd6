"""Memory and machine facts for a node's description.

On Linux, available = MemAvailable. On macOS, memory is unified and "free" is misleading, so
available means what the GPU may wire: Metal's recommended working set when MLX has Metal,
else the iogpu.wired_limit_mb sysctl when set, else Metal's default rule as real Macs show it.
Every value says which rule produced it. mlx is imported inside functions: the GUI reads this
without it.
"""

from __future__ import annotations

import logging
import platform
import re
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from engine.platform.device import (
    mac_gpu_name,
    metal_working_set,
    mlx_backend,
    mlx_device_info,
    nvidia_gpu_names,
)
from engine.platform.gpu_memory import mac_gpu_budget
from engine.platform.nvidia import probe_nvidia, this_machine_cuda_budget
from engine.platform.probes import CommandResult, run_command
from engine.records import MachineInfo, MemoryInfo

log = logging.getLogger(__name__)
GB = 1024 ** 3
Sysctl = Callable[[str], str | None]


def parse_meminfo(text: str) -> MemoryInfo:
    """/proc/meminfo → total and MemAvailable (kB in the file)."""
    fields = {m.group(1): int(m.group(2)) * 1024
              for m in re.finditer(r"^(\w+):\s+(\d+)\s*kB", text, re.M)}
    total = fields.get("MemTotal")
    if total is None:
        return MemoryInfo(None, None, "", unavailable="unavailable: /proc/meminfo has no MemTotal")
    if "MemAvailable" in fields:
        return MemoryInfo(total, fields["MemAvailable"], "MemAvailable from /proc/meminfo")
    # Kernels before 3.14 lack MemAvailable; free + page cache is the usual estimate.
    est = sum(fields.get(k, 0) for k in ("MemFree", "Buffers", "Cached"))
    return MemoryInfo(total, est, "MemFree + Buffers + Cached (no MemAvailable)")


def _sysctl(name: str) -> str | None:
    r: CommandResult = run_command(["sysctl", "-n", name], 3.0)
    return r.stdout.strip() if r.stdout is not None and r.stdout.strip() else None


def _int(v: str | None) -> int | None:
    return int(v) if v is not None and v.isdigit() else None


def memory_info(system: str | None = None, sysctl: Sysctl = _sysctl,
                meminfo: Path = Path("/proc/meminfo"),
                cuda: Callable[[], tuple[int, str] | None] = this_machine_cuda_budget
                ) -> MemoryInfo:
    """This machine's memory; never raises. Where MLX runs on CUDA, what a model may use
    is the GPU's VRAM (engine/platform/nvidia.py), not the system's RAM."""
    system = system or sys.platform
    if system == "darwin":
        total = _int(sysctl("hw.memsize"))
        if total is None:
            return MemoryInfo(None, None, "", unavailable="unavailable: sysctl hw.memsize failed")
        avail, rule = mac_gpu_budget(total, metal_working_set(),
                                     _int(sysctl("iogpu.wired_limit_mb")))
        return MemoryInfo(total, avail, rule, _int(sysctl("kern.memorystatus_level")))
    try:
        ram = parse_meminfo(meminfo.read_text())
    except OSError as e:
        return MemoryInfo(None, None, "", unavailable=f"unavailable: can't read {meminfo} ({e})")
    vram = cuda()
    return replace(ram, available_bytes=vram[0], rule=vram[1]) if vram else ram


def parse_cpuinfo(text: str) -> str | None:
    """/proc/cpuinfo → the first "model name" (x86) or "Model"/"Hardware" (ARM boards)."""
    for key in ("model name", "Model", "Hardware"):
        m = re.search(rf"^{key}\s*:\s*(.+)$", text, re.M)
        if m:
            return m.group(1).strip()
    return None


def parse_os_release(text: str) -> str | None:
    m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', text, re.M)
    return m.group(1) if m else None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def machine_info(system: str | None = None) -> MachineInfo:
    """Chip, OS, GPU, MLX and memory of this machine; slow parts bounded; never raises."""
    system = system or sys.platform
    version, backend = mlx_backend()
    if system == "darwin":
        chip = _sysctl("machdep.cpu.brand_string")
        r = run_command(["system_profiler", "SPDisplaysDataType", "-json"], 10.0)
        gpu = (mac_gpu_name(r.stdout) if r.stdout else None) or chip
        return MachineInfo(chip, "macOS", platform.mac_ver()[0] or platform.release(), gpu,
                           version, backend, memory_info(system))
    chip = parse_cpuinfo(_read(Path("/proc/cpuinfo")))
    os_name = parse_os_release(_read(Path("/etc/os-release")))
    nvidia = probe_nvidia()
    try:
        gpu = nvidia.summary or ", ".join(nvidia_gpu_names()) or None
    except OSError:
        gpu = None
    if gpu is None and backend == "cuda":
        gpu = str((mlx_device_info("cuda") or {}).get("device_name") or "CUDA GPU")
    return MachineInfo(chip or platform.processor() or None, os_name or platform.system(),
                       platform.release(), gpu, version, backend, memory_info(system), nvidia)
