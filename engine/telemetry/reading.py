"""One power reading, what every power source returns (power.py on Linux, ioreport.py on
macOS); its own module so neither source imports the other."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class PowerReading:
    watts: float | None = None       # total of what the source measures
    cpu_watts: float | None = None
    gpu_watts: float | None = None
    ane_watts: float | None = None
    dram_watts: float | None = None
    gpu_sram_watts: float | None = None  # kept apart from GPU power, as macmon does
    source: str = ""                 # "ioreport" | "rapl" | "nvml" | "rapl+nvml"
    unavailable: str | None = None
    at: float = 0.0                  # time.time() when measured

    def to_dict(self) -> dict[str, Any]:
        return {k: round(v, 2) if isinstance(v, float) and k.endswith("watts") else v
                for k, v in asdict(self).items()}


def missing(reason: str, source: str = "") -> PowerReading:
    return PowerReading(source=source, unavailable=reason, at=time.time())
