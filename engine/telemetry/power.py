"""Watts without root: IOReport on macOS (ioreport.py), RAPL + NVML on Linux, else
"unavailable: why".

Energy sources are stateful: each read() gives the average power since the previous read
(the first since construction). PowerSampler reads in a background thread and hands out the
last reading at once, so a caller never waits on a slow driver.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from engine.telemetry.reading import PowerReading, missing  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)
SERVING_READINGS = 120  # about two minutes of generating, at one reading a second
RAPL_UNREADABLE = ("unavailable: RAPL counters are not readable without root "
                   "(see /sys/class/powercap)")


class PowerSource(Protocol):
    def read(self) -> PowerReading: ...
    def close(self) -> None: ...


class Unavailable:
    def __init__(self, reason: str):
        self.reason = reason

    def read(self) -> PowerReading:
        return missing(self.reason)

    def close(self) -> None:
        pass


# --- Linux: RAPL ---------------------------------------------------------------------------
def counter_delta(prev: int, cur: int, max_range: int) -> int:
    """Energy between two counter reads; the counter wraps to 0 past max_range."""
    return cur - prev if cur >= prev else cur + max_range - prev


def rapl_watts(prev: Mapping[str, int], cur: Mapping[str, int], ranges: Mapping[str, int],
               names: Mapping[str, str], seconds: float) -> tuple[float | None, float | None]:
    """(total, cpu) watts from µJ counters of top-level zones. "psys" is the whole platform
    where the CPU has it; packages are the CPU; summing both would count the CPU twice."""
    if seconds <= 0:
        return None, None
    w = {z: counter_delta(prev[z], cur[z], ranges.get(z, 0)) / 1e6 / seconds
         for z in cur if z in prev}
    cpu = [v for z, v in w.items() if names.get(z, "").startswith("package")]
    psys = [v for z, v in w.items() if names.get(z) == "psys"]
    other = [v for z, v in w.items() if names.get(z) != "psys"]
    total = sum(psys) if psys else (sum(other) if other else None)
    return total, (sum(cpu) if cpu else None)


class RaplSource:
    def __init__(self, root: Path = Path("/sys/class/powercap"),
                 read: Callable[[Path], str] = lambda p: p.read_text(),
                 clock: Callable[[], float] = time.monotonic):
        self._read, self._clock = read, clock
        self.zones: dict[str, Path] = {}
        self.names: dict[str, str] = {}
        self.ranges: dict[str, int] = {}
        self.reason: str | None = None
        # Top-level zones only (intel-rapl:0, not intel-rapl:0:1): subzones are inside them.
        tops = sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1)
        denied = 0
        for z in tops:
            try:
                int(read(z / "energy_uj"))
                self.names[z.name] = _text(z / "name") or z.name
                self.ranges[z.name] = int(_text(z / "max_energy_range_uj") or 0)
                self.zones[z.name] = z
            except PermissionError:
                denied += 1
            except (OSError, ValueError) as e:
                log.debug("RAPL zone %s unreadable: %s", z, e)
        if not tops:
            self.reason = f"unavailable: no RAPL counters under {root}"
        elif not self.zones:
            self.reason = RAPL_UNREADABLE if denied else f"unavailable: RAPL counters under " \
                                                         f"{root} could not be read"
        self._prev = self._sample()

    def _sample(self) -> tuple[float, dict[str, int]]:
        values = {}
        for name, z in self.zones.items():
            try:
                values[name] = int(self._read(z / "energy_uj"))
            except (OSError, ValueError):
                pass
        return self._clock(), values

    def read(self) -> PowerReading:
        if self.reason:
            return missing(self.reason, "rapl")
        (t0, prev), (t1, cur) = self._prev, self._sample()
        self._prev = (t1, cur)
        total, cpu = rapl_watts(prev, cur, self.ranges, self.names, t1 - t0)
        if total is None:
            return missing("measuring: no interval yet", "rapl")
        return PowerReading(total, cpu, source="rapl", at=time.time())

    def close(self) -> None:
        pass


def _text(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except OSError:
        return None


# --- Linux: NVML (NVIDIA GPUs) ------------------------------------------------------------
class NvmlSource:
    """Instant board power of every NVIDIA GPU, through libnvidia-ml via ctypes."""

    def __init__(self, lib: Any = None, name: str = "libnvidia-ml.so.1"):
        self.reason: str | None = None
        self._handles: list[ctypes.c_void_p] = []
        try:
            self._lib = lib if lib is not None else ctypes.CDLL(name)
        except OSError as e:
            self._lib, self.reason = None, f"unavailable: NVML not found ({name}: {e})"
            return
        rc = self._lib.nvmlInit_v2()
        count = ctypes.c_uint(0)
        if rc == 0:
            rc = self._lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
        if rc != 0:
            self.reason = f"unavailable: NVML failed to start (error {rc})"
            return
        for i in range(count.value):
            h = ctypes.c_void_p()
            if self._lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(i), ctypes.byref(h)) == 0:
                self._handles.append(h)
        if not self._handles:
            self.reason = "unavailable: NVML sees no NVIDIA GPU"

    def read(self) -> PowerReading:
        if self.reason:
            return missing(self.reason, "nvml")
        mw, seen = 0, 0
        for h in self._handles:
            v = ctypes.c_uint(0)
            if self._lib.nvmlDeviceGetPowerUsage(h, ctypes.byref(v)) == 0:
                mw, seen = mw + v.value, seen + 1
        if not seen:
            return missing("unavailable: these GPUs don't report power through NVML", "nvml")
        return PowerReading(mw / 1000, gpu_watts=mw / 1000, source="nvml", at=time.time())

    def close(self) -> None:
        if self._lib is not None and not self.reason:
            self._lib.nvmlShutdown()


class LinuxPower:
    """RAPL (CPU/platform) plus NVML (GPUs): whichever parts this machine allows."""

    def __init__(self, rapl: PowerSource, nvml: PowerSource):
        self.rapl, self.nvml = rapl, nvml

    def read(self) -> PowerReading:
        r, n = self.rapl.read(), self.nvml.read()
        parts = [x for x in (r, n) if x.watts is not None]
        if not parts:
            return missing(f"{r.unavailable}; {n.unavailable}")
        return PowerReading(sum(x.watts for x in parts if x.watts is not None),
                            r.cpu_watts, n.gpu_watts,
                            source="+".join(x.source for x in parts), at=time.time())

    def close(self) -> None:
        self.rapl.close()
        self.nvml.close()


def default_source(system: str | None = None) -> PowerSource:
    """The best source this machine has; never raises."""
    system = system or sys.platform
    try:
        if system == "darwin":
            from engine.telemetry.ioreport import IOReportSource
            return IOReportSource()
        if system.startswith("linux"):
            return LinuxPower(RaplSource(), NvmlSource())
    except Exception as e:  # a private framework can change under us: report, don't crash
        log.warning("power source failed to start: %s", e)
        return Unavailable(f"unavailable: power source failed to start ({e})")
    return Unavailable(f"unavailable: no power source for {system}")


class PowerSampler:
    """Reads a source every `interval` seconds in a daemon thread; latest() never blocks.
    With `busy` (is the node generating now?), it also keeps the readings taken while
    busy: serving_watts() is what the planner's energy figures use where it is known."""

    def __init__(self, make_source: Callable[[], PowerSource] = default_source,
                 interval: float = 1.0, stale_after: float | None = None,
                 busy: Callable[[], bool] | None = None, keep: int = SERVING_READINGS):
        self.interval = interval
        self.stale_after = stale_after if stale_after is not None else max(5.0, 3 * interval)
        self._make = make_source
        self.busy = busy
        self._serving: deque[float] = deque(maxlen=keep)
        self._last = missing(f"measuring: the first reading comes after {interval:g} s")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> PowerSampler:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="power", daemon=True)
            self._thread.start()
        return self

    def latest(self) -> PowerReading:
        last = self._last
        stale = time.time() - last.at
        if last.at and stale > self.stale_after:
            return missing(f"unavailable: power source stopped answering ({stale:.0f} s)",
                           last.source)
        return last

    def serving_watts(self) -> float | None:
        """The mean of the last readings taken while the node generated (None: none yet)."""
        kept = list(self._serving)
        return sum(kept) / len(kept) if kept else None

    def _keep(self, reading: PowerReading) -> None:
        try:
            busy = self.busy is not None and self.busy()
        except Exception:  # a status read must never stop the readings
            log.exception("couldn't tell whether the node is busy")
            busy = False
        if busy and reading.watts:
            self._serving.append(reading.watts)

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        try:  # slow driver start-up happens here, off the caller's thread
            source = self._make()
        except Exception as e:
            source = Unavailable(f"unavailable: power source failed to start ({e})")
        try:
            while not self._stop.wait(self.interval):
                try:
                    self._last = source.read()
                    self._keep(self._last)
                except Exception as e:
                    log.warning("power reading failed: %s", e)
                    self._last = missing(f"unavailable: power reading failed ({e})")
        finally:
            source.close()
