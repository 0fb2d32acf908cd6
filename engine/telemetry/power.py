"""Watts without root: IOReport on macOS, RAPL + NVML on Linux, else "unavailable: why".

Energy sources are stateful: each read() gives the average power since the previous read
(the first since construction). PowerSampler reads in a background thread and hands out the
last reading at once, so a caller never waits on a slow driver.
"""

from __future__ import annotations

import ctypes
import logging
import re
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol

log = logging.getLogger(__name__)
RAPL_UNREADABLE = ("unavailable: RAPL counters are not readable without root "
                   "(see /sys/class/powercap)")
UNIT_JOULES = {"mJ": 1e-3, "uJ": 1e-6, "µJ": 1e-6, "nJ": 1e-9}


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


# --- macOS: IOReport "Energy Model" ------------------------------------------------------
# Channels publish at their own cadence (on an M1 Ultra the CPU, ANE and DRAM channels about
# twice every 2.1 s, GPU Energy every ~120 ms), in mixed units. Dividing one sample's delta by
# the sampling interval reads 0 W, then about twice the truth; so each channel's energy is
# divided by its own publication span, summed over a window of recent publications.
WINDOW_S = 2.5           # at least one full publication cycle of the slowest channel
CLOCK_WINDOW_S = 8.0     # spans timed by our own samples: a longer window evens out the error
STALE_S = 10.0           # a channel silent this long is dropped, not shown as live
IDLE_AFTER_S = 5.0       # an unchanged counter this long is a channel at 0 W


def channel_part(name: str) -> str | None:
    """Which part an Energy Model channel belongs to. Names vary by chip: "CPU Energy" or
    "DIE_1_CPU Energy" (Ultra), "ANE"/"ANE0"/"ANE0_1", "DRAM0"/"DRAM0_0"; "GPU<n>" carries the
    same energy as "GPU Energy" (a fallback); "GPU SRAM" is its own part. Per-core and
    sub-channels are skipped: the aggregates already hold them."""
    if name == "GPU Energy":
        return "gpu"
    if name.endswith("CPU Energy"):
        return "cpu"
    if name.startswith("GPU SRAM"):
        return "gpu_sram"
    if re.fullmatch(r"GPU\d+", name):
        return "gpu_fallback"
    for prefix, part in (("ANE", "ane"), ("DRAM", "dram")):
        if re.fullmatch(rf"{prefix}(\d+(_\d+)?)?", name):
            return part
    return None


@dataclass(frozen=True)
class Publication:
    """Energy one channel published: `value` in `unit` over `span_s`, the time since that
    channel's previous publication. span_s 0 means nothing new was published."""
    channel: str
    unit: str
    value: int
    span_s: float


@dataclass
class _Channel:
    part: str
    scale: float
    spans: deque[tuple[float, float]] = field(default_factory=deque)  # (joules, seconds)
    carry_j: float = 0.0         # energy seen with no span yet; folds into the next one
    last_at: float | None = None  # when it last published


class EnergyIntegrator:
    """Watts per part from each channel's own publications: the energy over a window of its
    recent publication spans divided by their total length, so a short tail publication (an
    18 ms span after a 1.7 s one) or a sample with nothing new changes nothing."""

    def __init__(self, window_s: float = WINDOW_S, stale_s: float = STALE_S,
                 source: str = "ioreport"):
        self.window_s, self.stale_s, self.source = window_s, stale_s, source
        self._channels: dict[str, _Channel] = {}
        self._names: list[str] = []
        self._bad_units: set[str] = set()
        self._started: float | None = None

    def add(self, publications: Iterable[Publication], now: float) -> None:
        if self._started is None:
            self._started = now
        for pub in publications:
            if pub.channel not in self._names:
                self._names.append(pub.channel)
            part, scale = channel_part(pub.channel), UNIT_JOULES.get(pub.unit.strip())
            if part is None:
                continue
            if scale is None:
                self._bad_units.add(pub.unit.strip())
                continue
            ch = self._channels.setdefault(pub.channel, _Channel(part, scale))
            if pub.span_s <= 0:
                ch.carry_j += pub.value * scale
                continue
            ch.spans.append((pub.value * scale + ch.carry_j, pub.span_s))
            ch.carry_j, ch.last_at = 0.0, now
            total = sum(dt for _, dt in ch.spans)
            while len(ch.spans) > 1 and total - ch.spans[0][1] >= self.window_s:
                total -= ch.spans.popleft()[1]

    def reading(self, now: float) -> PowerReading:
        live = {n: c for n, c in self._channels.items()
                if c.last_at is not None and now - c.last_at <= self.stale_s}
        waiting = [n for n, c in self._channels.items() if c.last_at is None]
        if waiting and self._started is not None and now - self._started < self.stale_s:
            return missing(f"measuring: waiting for {', '.join(waiting[:4])} to publish",
                           self.source)
        parts: dict[str, float] = {}
        for c in live.values():
            joules, seconds = (sum(x) for x in zip(*c.spans))
            parts[c.part] = parts.get(c.part, 0.0) + joules / seconds
        if "gpu" not in parts and "gpu_fallback" in parts:
            parts["gpu"] = parts["gpu_fallback"]
        main = {k: v for k, v in parts.items() if k in ("cpu", "gpu", "ane", "dram")}
        if not main:
            why = (f"energy units {sorted(self._bad_units)} unknown" if self._bad_units else
                   f"no CPU/GPU/ANE channel among {self._names[:8] or 'none'}")
            if self._channels and not live:
                why = f"no channel published in the last {self.stale_s:g} s"
            return missing(f"unavailable: IOReport Energy Model: {why}", self.source)
        # DRAM counts; GPU SRAM does not (macmon and all-smi keep it out of the total).
        return PowerReading(sum(main.values()), main.get("cpu"), main.get("gpu"),
                            main.get("ane"), main.get("dram"), parts.get("gpu_sram"),
                            source=self.source, at=time.time())


def energy_reading(channels: Iterable[tuple[str, str, int]], seconds: float,
                   source: str = "ioreport") -> PowerReading:
    """(channel name, unit label, energy in that unit), all published over the same
    `seconds` → watts per part."""
    if seconds <= 0:
        return missing("measuring: no interval yet", source)
    acc = EnergyIntegrator(source=source)
    acc.add((Publication(n, u, v, seconds) for n, u, v in channels), 0.0)
    return acc.reading(0.0)


class PublicationClock:
    """Publications from successive sample deltas when IOReport gives no per-channel
    timestamps: a counter that moved has published, over the time since it last moved (in
    our own sample times). The first move only starts the clock; a counter that stays still
    for `idle_after_s` is a channel at 0 W."""

    def __init__(self, now: float, idle_after_s: float = IDLE_AFTER_S):
        self.idle_after_s = idle_after_s
        self._start = now
        self._moved: dict[str, float] = {}

    def publications(self, deltas: Iterable[tuple[str, str, int]], now: float
                     ) -> list[Publication]:
        out = []
        for name, unit, value in deltas:
            last = self._moved.get(name)
            if value == 0 and now - (last if last is not None else self._start) \
                    < self.idle_after_s:
                continue
            if last is None and value != 0:
                self._moved[name] = now  # its span began at an unknown publication
                continue
            out.append(Publication(name, unit, value,
                                   now - (last if last is not None else self._start)))
            self._moved[name] = now
        return out


class IOReportSource:
    """What powermetrics reads, without sudo: subscribe to the "Energy Model" channel group of
    the private libIOReport, and turn the energy delta between two samples into watts.
    All CoreFoundation/ctypes handling stays in this class. macOS only."""

    UTF8 = 0x08000100  # kCFStringEncodingUTF8

    def __init__(self) -> None:
        vp = ctypes.c_void_p
        cf = ctypes.CDLL("/System/Library/Frameworks/CoreFoundation.framework/CoreFoundation")
        io = ctypes.CDLL("/usr/lib/libIOReport.dylib")  # found in the dyld cache
        signatures: tuple[tuple[Any, Any, list[Any]], ...] = (
                (cf.CFStringCreateWithCString, vp, [vp, ctypes.c_char_p, ctypes.c_uint32]),
                (cf.CFStringGetCString, ctypes.c_bool, [vp, ctypes.c_char_p, ctypes.c_long,
                                                        ctypes.c_uint32]),
                (cf.CFDictionaryGetCount, ctypes.c_long, [vp]),
                (cf.CFDictionaryCreateMutableCopy, vp, [vp, ctypes.c_long, vp]),
                (cf.CFDictionaryGetValue, vp, [vp, vp]),
                (cf.CFArrayGetCount, ctypes.c_long, [vp]),
                (cf.CFArrayGetValueAtIndex, vp, [vp, ctypes.c_long]),
                (cf.CFRelease, None, [vp]),
                (io.IOReportCopyChannelsInGroup, vp, [vp, vp, ctypes.c_uint64, ctypes.c_uint64,
                                                      ctypes.c_uint64]),
                (io.IOReportCreateSubscription, vp, [vp, vp, ctypes.POINTER(vp),
                                                     ctypes.c_uint64, vp]),
                (io.IOReportCreateSamples, vp, [vp, vp, vp]),
                (io.IOReportCreateSamplesDelta, vp, [vp, vp, vp]),
                (io.IOReportChannelGetChannelName, vp, [vp]),
                (io.IOReportChannelGetUnitLabel, vp, [vp]),
                (io.IOReportSimpleGetIntegerValue, ctypes.c_int64, [vp, vp]))
        for fn, res, args in signatures:
            fn.restype, fn.argtypes = res, args
        self.cf, self.io = cf, io
        group = self._cfstr("Energy Model")
        chans = io.IOReportCopyChannelsInGroup(group, None, 0, 0, 0)
        cf.CFRelease(group)
        if not chans:
            raise OSError("IOReport has no Energy Model channels on this Mac")
        self._chans = cf.CFDictionaryCreateMutableCopy(None, cf.CFDictionaryGetCount(chans),
                                                       chans)
        cf.CFRelease(chans)
        self._subbed = vp()
        self._sub = io.IOReportCreateSubscription(None, self._chans, ctypes.byref(self._subbed),
                                                  0, None)
        if not self._sub:
            raise OSError("IOReport refused the Energy Model subscription")
        self._prev, self._t = io.IOReportCreateSamples(self._sub, self._chans, None), \
            time.monotonic()
        self._clock = PublicationClock(self._t)
        self._energy = EnergyIntegrator(window_s=CLOCK_WINDOW_S)

    def _cfstr(self, s: str) -> Any:
        return self.cf.CFStringCreateWithCString(None, s.encode(), self.UTF8)

    def _pystr(self, ref: Any) -> str:  # Get-rule string: not ours to release
        buf = ctypes.create_string_buffer(256)
        ok = ref and self.cf.CFStringGetCString(ref, buf, len(buf), self.UTF8)
        return buf.value.decode("utf-8", "replace") if ok else ""

    def read(self) -> PowerReading:
        cf, io = self.cf, self.io
        cur, t = io.IOReportCreateSamples(self._sub, self._chans, None), time.monotonic()
        if not cur or not self._prev:
            self._prev, self._t = cur, t
            return missing("unavailable: IOReport returned no sample", "ioreport")
        delta = io.IOReportCreateSamplesDelta(self._prev, cur, None)
        cf.CFRelease(self._prev)
        self._prev, self._t = cur, t
        if not delta:
            return missing("unavailable: IOReport returned no sample delta", "ioreport")
        try:
            key = self._cfstr("IOReportChannels")
            items = cf.CFDictionaryGetValue(delta, key)
            cf.CFRelease(key)
            channels = []
            for i in range(cf.CFArrayGetCount(items) if items else 0):
                item = cf.CFArrayGetValueAtIndex(items, i)
                channels.append((self._pystr(io.IOReportChannelGetChannelName(item)),
                                 self._pystr(io.IOReportChannelGetUnitLabel(item)),
                                 io.IOReportSimpleGetIntegerValue(item, None)))
        finally:
            cf.CFRelease(delta)
        self._energy.add(self._clock.publications(channels, t), t)
        return self._energy.reading(t)

    def close(self) -> None:
        # Only what we surely own; the subscription lives until the process ends (one leak
        # beats a crash if the private API's ownership rules differ).
        for ref in (self._prev, self._chans):
            if ref:
                self.cf.CFRelease(ref)
        self._prev = self._chans = None


def default_source(system: str | None = None) -> PowerSource:
    """The best source this machine has; never raises."""
    system = system or sys.platform
    try:
        if system == "darwin":
            return IOReportSource()
        if system.startswith("linux"):
            return LinuxPower(RaplSource(), NvmlSource())
    except Exception as e:  # a private framework can change under us: report, don't crash
        log.warning("power source failed to start: %s", e)
        return Unavailable(f"unavailable: power source failed to start ({e})")
    return Unavailable(f"unavailable: no power source for {system}")


class PowerSampler:
    """Reads a source every `interval` seconds in a daemon thread; latest() never blocks."""

    def __init__(self, make_source: Callable[[], PowerSource] = default_source,
                 interval: float = 1.0, stale_after: float | None = None):
        self.interval = interval
        self.stale_after = stale_after if stale_after is not None else max(5.0, 3 * interval)
        self._make = make_source
        self._last = missing(f"measuring: the first reading comes after {interval:g} s")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "PowerSampler":
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
                except Exception as e:
                    log.warning("power reading failed: %s", e)
                    self._last = missing(f"unavailable: power reading failed ({e})")
        finally:
            source.close()
