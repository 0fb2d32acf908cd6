"""What this node tells others about itself: machine (chip, OS, GPU, MLX, memory),
platform (Thunderbolt cabling, RDMA, interfaces, warnings) and power. Slow probes run off
the event loop and are refreshed in the background; describe() never blocks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.platform.probes import PlatformReport
from engine.records import MachineInfo, PowerInfo, SpeedInfo

log = logging.getLogger(__name__)
MEMORY_EVERY_S = 5.0
PLATFORM_EVERY_S = 60.0  # cables get plugged and pulled


@dataclass(frozen=True)
class Facts:
    """The parts of NodeInfo this module measures (None: not yet)."""
    machine: MachineInfo | None = None
    speed: SpeedInfo = field(default_factory=SpeedInfo)
    platform: PlatformReport | None = None
    power: PowerInfo | None = None


class NodeFacts:
    def __init__(self, home: Any = None, busy: Any = None) -> None:
        self.home = home
        self.busy = busy  # () -> bool: is this node generating now (its power then counts)
        self.calibration: SpeedInfo | None = None
        self.machine: MachineInfo | None = None
        self.platform: PlatformReport | None = None
        self._sampler: Any = None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        from engine.telemetry.power import PowerSampler
        self._sampler = PowerSampler(busy=self.busy).start()
        self._task = asyncio.create_task(self._refresh())

    async def _refresh(self) -> None:
        from engine.telemetry.memory import machine_info, memory_info
        since_platform = PLATFORM_EVERY_S
        while True:
            try:
                if self.machine is None:
                    self.machine = await asyncio.to_thread(_machine, machine_info)
                    if self.home is not None and os.environ.get("SHOAL_CALIBRATE") != "0":
                        from engine.telemetry.calibrate import VERSION, calibration
                        key = (f"{self.machine.chip}|{self.machine.mlx_version}|"
                               f"{VERSION}")
                        self.calibration = await asyncio.to_thread(calibration, self.home,
                                                                   key)
                else:
                    mem = await asyncio.to_thread(memory_info)
                    self.machine = replace(self.machine, memory=mem)
                if since_platform >= PLATFORM_EVERY_S:
                    self.platform = await asyncio.to_thread(_platform)
                    since_platform = 0.0
            except Exception:  # a probe must never take the node down
                log.exception("refreshing this node's facts failed")
            await asyncio.sleep(MEMORY_EVERY_S)
            since_platform += MEMORY_EVERY_S

    def describe(self) -> Facts:
        power = PowerInfo.from_json(self._sampler.latest().rounded().to_json()) if self._sampler \
            else None
        serving = self._sampler.serving_watts() if self._sampler else None
        if power is not None and serving:  # measured while generating: the planner's watts
            power = replace(power, serving_watts=round(serving, 2))
        return Facts(self.machine, self.calibration or SpeedInfo(), self.platform, power)

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._sampler:
            await asyncio.to_thread(self._sampler.stop)


def _machine(machine_info: Any) -> MachineInfo:
    """The machine, with the engine its GGUF imports run on where that isn't MLX (the
    planner reads it: engine/node/cpu_engine.py)."""
    from engine.node.cpu_engine import gguf_engine
    return replace(machine_info(), cpu_engine=gguf_engine())


def capped(facts: Facts, limit: int | None) -> Facts:
    """The machine's facts with its usable memory cut to the user's --memory-limit, so
    the planner and the window see the budget requests are admitted under."""
    machine = facts.machine
    if not limit or machine is None:
        return facts
    memory, have = machine.memory, machine.memory.available_bytes
    memory = replace(memory, available_bytes=min(have, limit) if have else limit,
                     rule=f"--memory-limit {limit / 1e9:g} GB"
                     + (f" (the machine: {memory.rule})" if memory.rule else ""))
    return replace(facts, machine=replace(machine, memory=memory))


def _platform() -> PlatformReport:
    """This machine's platform report, or, with SHOAL_PLATFORM_RECORDING set (tests on
    Linux), a Mac's as its commands printed it."""
    from engine.platform.probes import probe_platform, recorded_runner
    recording = os.environ.get("SHOAL_PLATFORM_RECORDING")
    if recording:
        return probe_platform(system="darwin", runner=recorded_runner(Path(recording)))
    return probe_platform()
