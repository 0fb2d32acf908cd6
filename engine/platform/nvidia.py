"""NVIDIA GPUs as `nvidia-smi` reports them, and the memory MLX's CUDA build may use on one.

One bounded call (no shell, a timeout) of
`nvidia-smi --query-gpu=<FIELDS> --format=csv,nounits`, parsed by its header's column names,
so output with more columns, units or another order (an older driver, a recording of every
field) reads the same. A missing tool, a driver that doesn't answer, a timeout or output
that isn't the CSV asked for gives a report with no GPUs and the reason, never an exception.
Values the driver can't give ("[N/A]" on a DGX Spark's unified memory, "[Not Supported]")
are None.
"""

from __future__ import annotations

import csv
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the probe's runner; imported when it runs, so the planner can read
    from engine.platform.probes import Runner  # the VRAM rule without subprocess

MIB = 1024 ** 2
FIELDS = ("name", "memory.total", "memory.used", "driver_version", "compute_cap",
          "power.draw", "power.limit", "mig.mode.current")
COMMAND = ("nvidia-smi", "--query-gpu=" + ",".join(FIELDS), "--format=csv,nounits")
TIMEOUT_S = 5.0  # nvidia-smi answers in well under a second; a hung driver must not hang us
MAX_GPUS = 64  # more rows than any box holds: the rest is not a GPU list
# MLX's CUDA allocator keeps its buffers under 95% of the device's memory (allocator.cpp);
# the CUDA context, cuBLAS's workspace and a desktop's display live outside that count
MLX_CUDA_FRACTION = 0.9
_UNIT = re.compile(r"\s*\[[^\]]*\]$")  # "memory.total [MiB]" → "memory.total"


@dataclass(frozen=True)
class NvidiaGpu:
    """One GPU: its name, memory (None where the driver has no figure: unified memory),
    driver, compute capability ("8.9") and power."""
    name: str
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    driver: str | None = None
    compute_capability: str | None = None
    power_draw_watts: float | None = None
    power_limit_watts: float | None = None
    mig: bool | None = None  # Multi-Instance GPU on: CUDA sees a slice, not the whole card

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_json(cls, d: Any) -> NvidiaGpu | None:
        """A GPU from a peer's JSON; None for anything without a name."""
        if not isinstance(d, dict) or not isinstance(d.get("name"), str):
            return None

        def num(key: str) -> float | None:
            v = d.get(key)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        def text(key: str) -> str | None:
            return d[key] if isinstance(d.get(key), str) else None
        total, used = num("memory_total_bytes"), num("memory_used_bytes")
        mig = d.get("mig")
        return cls(d["name"], int(total) if total is not None else None,
                   int(used) if used is not None else None, text("driver"),
                   text("compute_capability"), num("power_draw_watts"),
                   num("power_limit_watts"), mig if isinstance(mig, bool) else None)


@dataclass(frozen=True)
class NvidiaReport:
    """The machine's NVIDIA GPUs, or none and why (`unavailable`)."""
    gpus: tuple[NvidiaGpu, ...] = ()
    unavailable: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"gpus": [g.to_json() for g in self.gpus]}
        if self.unavailable:
            out["unavailable"] = self.unavailable
        return out

    @classmethod
    def from_json(cls, d: Any) -> NvidiaReport:
        """A peer's report; never raises."""
        if not isinstance(d, dict):
            return cls((), "unavailable: peer sent no GPU report")
        gpus = [NvidiaGpu.from_json(g) for g in d.get("gpus") or [] if isinstance(g, dict)]
        why = d.get("unavailable")
        return cls(tuple(g for g in gpus if g is not None),
                   why if isinstance(why, str) else None)

    @property
    def summary(self) -> str | None:
        """"NVIDIA GeForce RTX 4090 (24.0 GiB), ..." for the machine's GPU line."""
        if not self.gpus:
            return None
        return ", ".join(g.name + (f" ({g.memory_total_bytes / 1024 ** 3:.1f} GiB)"
                                   if g.memory_total_bytes else "") for g in self.gpus)


def probe_nvidia(runner: Runner | None = None, timeout: float = TIMEOUT_S) -> NvidiaReport:
    """This machine's NVIDIA GPUs from one bounded `nvidia-smi` call."""
    if runner is None:
        from engine.platform.probes import run_command
        runner = run_command
    r = runner(COMMAND, timeout)
    if r.stdout is None:
        return NvidiaReport((), r.reason or "unavailable: nvidia-smi gave no output")
    return parse_query_csv(r.stdout)


def parse_query_csv(text: str) -> NvidiaReport:
    """`nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]` → the GPUs. With a
    header, columns are found by name; without one they must be FIELDS in order."""
    rows = [r for r in csv.reader(text.splitlines()[:MAX_GPUS + 1], skipinitialspace=True)
            if any(c.strip() for c in r)]
    if not rows:
        return NvidiaReport((), "unavailable: nvidia-smi printed no GPUs")
    header = [_UNIT.sub("", c.strip()) for c in rows[0]]
    if "name" in header:
        body = rows[1:]
    elif len(rows[0]) == len(FIELDS):
        header, body = list(FIELDS), rows
    else:
        return NvidiaReport((), "unavailable: nvidia-smi printed something other than the "
                                f"GPU list asked for: {rows[0][0][:80]!r}")
    gpus = [g for g in (_gpu(dict(zip(header, r, strict=False))) for r in body) if g]
    if not gpus:
        return NvidiaReport((), "unavailable: nvidia-smi listed no GPU with a name")
    return NvidiaReport(tuple(gpus))


def _gpu(cells: dict[str, str]) -> NvidiaGpu | None:
    name = _value(cells.get("name"))
    if not name:
        return None
    total, used = _number(cells.get("memory.total")), _number(cells.get("memory.used"))
    cap = _value(cells.get("compute_cap"))
    mig = _value(cells.get("mig.mode.current"))
    return NvidiaGpu(name[:200],
                     int(total * MIB) if total is not None else None,
                     int(used * MIB) if used is not None else None,
                     (_value(cells.get("driver_version")) or "")[:40] or None,
                     cap if cap and re.fullmatch(r"\d+\.\d+", cap) else None,
                     _number(cells.get("power.draw")), _number(cells.get("power.limit")),
                     None if mig is None else mig.lower() == "enabled")


def _value(cell: str | None) -> str | None:
    """A cell's text; None for what the driver couldn't give ("[N/A]", "[Not Supported]",
    "N/A", empty)."""
    v = (cell or "").strip()
    return None if not v or v.startswith("[") or v.upper() == "N/A" else v


def _number(cell: str | None) -> float | None:
    """"81559 MiB", "69.85 W" or "81559" → the number; None where there is none."""
    v = _value(cell)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(?:\s*[A-Za-z%]+)?", v or "")
    return float(m.group(1)) if m else None


def vram_budget(total: int) -> int:
    """What MLX's CUDA build may hold on a GPU with `total` bytes of its own memory."""
    return int(total * MLX_CUDA_FRACTION)


def cuda_gpu_budget(gpus: Sequence[NvidiaGpu], mlx_total: int | None = None
                    ) -> tuple[int, str] | None:
    """What MLX's CUDA build may hold on this machine, and the rule used: 90% of the
    device's memory (MLX_CUDA_FRACTION). MLX uses one device, the first CUDA
    sees; its own figure (`mlx_total`, mx.device_info()) wins, since it knows
    CUDA_VISIBLE_DEVICES and MIG slices, and on a DGX Spark it is what CUDA sees of the
    unified memory. None where neither tells (a Spark's nvidia-smi says [N/A]): then the
    system's MemAvailable stays the rule."""
    if mlx_total:
        total, where = mlx_total, "MLX's device info"
    elif gpus and gpus[0].memory_total_bytes:
        total, where = gpus[0].memory_total_bytes, f"nvidia-smi, {gpus[0].name}"
    else:
        return None
    return vram_budget(total), (f"90% of the GPU's {total / 1024 ** 3:.1f} GiB of VRAM "
                                f"({where}), the rest for the CUDA context")


@functools.cache
def this_machine_cuda_budget() -> tuple[int, str] | None:
    """cuda_gpu_budget for this machine when MLX runs on CUDA here, else None. Probed once
    per process: a card's memory doesn't change while it runs."""
    from engine.platform.device import mlx_backend, mlx_device_info
    if mlx_backend()[1] != "cuda":
        return None
    info = mlx_device_info("cuda") or {}
    total = info.get("total_memory") or info.get("memory_size")
    return cuda_gpu_budget(probe_nvidia().gpus, int(total) if isinstance(total, int) else None)
