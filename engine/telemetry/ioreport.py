"""Watts on macOS without sudo: IOReport's "Energy Model" channels.

The maths is pure and checked against a real M1 Ultra trace (tests/fixtures/macos/captured/
ioreport/): channels become publications (energy over that channel's own span), publications
become watts per part. IOReportSource is the ctypes binding to the private libIOReport.
"""

from __future__ import annotations

import ctypes
import re
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from engine.telemetry.reading import PowerReading, missing

UNIT_JOULES = {"mJ": 1e-3, "uJ": 1e-6, "µJ": 1e-6, "nJ": 1e-9}

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
            since = now - (last if last is not None else self._start)
            if last is None and value != 0:
                self._moved[name] = now  # its span began at a publication we didn't see
                out.append(Publication(name, unit, 0, 0.0))  # seen, not timed yet
            elif value != 0 or since >= self.idle_after_s:
                self._moved[name] = now
                out.append(Publication(name, unit, value, since))
            else:
                out.append(Publication(name, unit, 0, 0.0))  # nothing new
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
