"""Power without root: IOReport energy maths on a real M1 Ultra trace of channel publications
(tests/fixtures/macos/captured/ioreport/) and on recordings (tests/fixtures/macos/ioreport/),
RAPL on a recorded powercap layout rebuilt in tmp_path, NVML through a stand-in for
libnvidia-ml, and the sampler's bounds."""

from __future__ import annotations

import ctypes
import json
import re
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from engine.telemetry.ioreport import (
    EnergyIntegrator,
    Publication,
    PublicationClock,
    channel_part,
    energy_reading,
)
from engine.telemetry.power import (
    RAPL_UNREADABLE,
    LinuxPower,
    NvmlSource,
    PowerReading,
    PowerSampler,
    RaplSource,
    Unavailable,
    counter_delta,
    default_source,
    missing,
    rapl_watts,
)
from tests_support import wait_until  # noqa: E402

MACOS = Path(__file__).resolve().parents[2] / "fixtures" / "macos"
IOREPORT = MACOS / "ioreport"
TRACE = MACOS / "captured/ioreport/allsmi_pr424_m1ultra_trace_excerpt.txt"


def read_trace(path: Path) -> list[tuple[float, list[Publication], dict[str, float]]]:
    """all-smi's IOReport trace: per sample its time, each channel's delta and publication
    span, and the watts all-smi showed."""
    rows = []
    for line in path.read_text().splitlines():
        m = re.match(r"\d+ t=([\d.]+)s sample=[\d.]+ms (.*) \|\| (.*)$", line)
        if not m:
            continue
        fields = [re.fullmatch(r"(.+) dv=(\d+)(\w+) dts=([\d.]+)ms age=[\d.]+ms", part)
                  for part in m.group(2).split(" | ")]
        pubs = [Publication(c.group(1), c.group(3), int(c.group(2)), float(c.group(4)) / 1000)
                for c in fields if c]
        shown = {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)W", m.group(3))}
        rows.append((float(m.group(1)), pubs, shown))
    return rows


def test_real_m1_ultra_trace_reads_steady_watts_not_209_then_0():
    rows = read_trace(TRACE)
    assert len(rows) == 3 and len(rows[1][1]) == 8
    acc = EnergyIntegrator()
    readings = []
    for t, pubs, _ in rows:
        acc.add(pubs, t)
        readings.append(acc.reading(t))
    # Sample 053: the CPU, ANE and DRAM channels have published nothing yet; no made-up number.
    assert readings[0].watts is None and "DIE_0_CPU Energy" in (readings[0].unavailable or "")
    # Then each channel's energy over its own span: about 14.7 W of CPU on both samples,
    # even across the 18 ms tail publication of sample 055.
    for r in readings[1:]:
        assert r.cpu_watts == pytest.approx(14.68, rel=0.01)
        assert r.ane_watts == pytest.approx(0.18, abs=0.01)
        assert r.dram_watts == pytest.approx(3.90, rel=0.01)
        assert 0.13 <= (r.gpu_watts or 0) <= 0.27
        assert r.watts == pytest.approx(sum((r.cpu_watts or 0, r.gpu_watts or 0,
                                             r.ane_watts or 0, r.dram_watts or 0)))
    # What dividing one sample's delta by the time between samples would have shown.
    (t0, _, _), (t1, pubs, _) = rows[0], rows[1]
    naive = energy_reading([(p.channel, p.unit, p.value) for p in pubs], t1 - t0)
    assert (naive.cpu_watts or 0) > 200


def test_readings_from_our_own_sample_clock_stay_near_the_truth():
    # No per-channel timestamps: sample the M1 Ultra's cadence once a second. CPU publishes
    # 14.7 W twice every 2.1 s (the second 18 ms after the first), GPU 0.26 W every 120 ms.
    def counter(t: float, watts: float, period: float, tail: float = 0.0) -> float:
        """Energy published by time t (mJ): cycles end at k*period, a tail `tail` later."""
        k = int(t // period)
        done = k * period * watts
        if tail and t - k * period >= tail:
            done += tail * watts
        return done * 1000

    def cumulative(t: float) -> dict[str, float]:
        return {"DIE_0_CPU Energy": counter(t - 0.018, 14.7, 2.1, 0.018)
                if t >= 0.018 else 0.0, "GPU Energy": counter(t, 0.26, 0.12) * 1e6}

    clock, acc = PublicationClock(0.37), EnergyIntegrator(window_s=8.0)
    prev, cpu, naive = cumulative(0.37), [], []
    for i in range(1, 90):
        t = 0.37 + i
        cur = cumulative(t)
        deltas = [("DIE_0_CPU Energy", "mJ", int(cur["DIE_0_CPU Energy"])
                   - int(prev["DIE_0_CPU Energy"])),
                  ("GPU Energy", "nJ", int(cur["GPU Energy"]) - int(prev["GPU Energy"]))]
        naive.append(deltas[0][2] / 1000)
        prev = cur
        acc.add(clock.publications(deltas, t), t)
        r = acc.reading(t)
        # Until the CPU channel has a span of its own: "measuring", never a GPU-only total.
        assert r.cpu_watts is not None or (r.unavailable or "").startswith("measuring")
        if i > 12:
            cpu.append(r.cpu_watts or 0.0)
            assert r.gpu_watts == pytest.approx(0.26, rel=0.1)
    assert min(naive) == 0 and max(naive) > 25  # the per-sample reading jumps
    assert all(abs(w - 14.7) / 14.7 < 0.1 for w in cpu), (min(cpu), max(cpu))


def test_a_channel_that_never_moves_reads_zero_after_a_while():
    clock, acc = PublicationClock(0.0), EnergyIntegrator()
    for t in range(1, 8):
        acc.add(clock.publications([("ANE0_0", "mJ", 0), ("CPU Energy", "mJ", 1000)], t), t)
    r = acc.reading(7.0)
    assert (r.cpu_watts, r.ane_watts) == (pytest.approx(1.0), 0.0)


def test_a_silent_channel_goes_stale():
    acc = EnergyIntegrator(stale_s=10)
    acc.add([Publication("CPU Energy", "mJ", 2000, 2.0)], 0.0)
    assert acc.reading(5.0).cpu_watts == pytest.approx(1.0)
    assert "no channel published in the last 10 s" in (acc.reading(11.0).unavailable or "")


def test_ioreport_recordings_to_watts():
    rec = json.loads((IOREPORT / "m1_pro_idle_mJ.json").read_text())
    r = energy_reading([tuple(c) for c in rec["channels"]], rec["interval_s"])
    want = rec["expected_watts"]
    assert r.unavailable is None and r.source == "ioreport"
    assert (r.cpu_watts, r.gpu_watts, r.ane_watts, r.dram_watts, r.watts) == pytest.approx(
        (want["cpu"], want["gpu"], want["ane"], want["dram"], want["total"]))


def test_mixed_units_own_spans_and_gpu_sram_kept_apart():
    rec = json.loads((IOREPORT / "m3_ultra_decode_mixed.json").read_text())
    acc = EnergyIntegrator()
    acc.add([Publication(*c) for c in rec["publications"]], 0.0)
    r, want = acc.reading(0.0), rec["expected_watts"]
    assert (r.cpu_watts, r.gpu_watts, r.gpu_sram_watts, r.ane_watts, r.dram_watts,
            r.watts) == pytest.approx((want["cpu"], want["gpu"], want["gpu_sram"], want["ane"],
                                       want["dram"], want["total"]))
    # Without a "GPU Energy" channel, GPU<n> carries the GPU's energy.
    acc = EnergyIntegrator()
    acc.add([Publication("GPU0", "mJ", 3000, 1.5)], 0.0)
    assert acc.reading(0.0).gpu_watts == pytest.approx(2.0)


def test_unit_labels():
    one_second = [("GPU Energy", "mJ", 1500)]
    assert energy_reading(one_second, 1.0).gpu_watts == pytest.approx(1.5)
    assert energy_reading([("GPU Energy", "uJ", 1500000)], 1.0).gpu_watts == pytest.approx(1.5)
    assert energy_reading([("GPU Energy", " nJ ", 3 * 10**9)], 2.0).gpu_watts == \
        pytest.approx(1.5)


def test_channel_names_across_generations():
    assert [channel_part(n) for n in ("CPU Energy", "DIE_1_CPU Energy", "GPU Energy",
                                      "GPU SRAM0", "GPU0", "GPU0_0", "ANE", "ANE0_1",
                                      "ANE0_SRAM", "DRAM0", "DRAM0_1", "PCPU3", "DISP",
                                      "ECPU")] == \
        ["cpu", "cpu", "gpu", "gpu_sram", "gpu_fallback", None, "ane", "ane", None, "dram",
         "dram", None, None, None]


def test_unknown_channels_or_units_fail_soft():
    rec = json.loads((IOREPORT / "future_chip_unknown.json").read_text())
    r = energy_reading([tuple(c) for c in rec["channels"]], rec["interval_s"])
    assert r.watts is None and "energy units ['J?', 'kWh'] unknown" in (r.unavailable or "")
    r = energy_reading([("SOC_A", "mJ", 5)], 1.0)
    assert "no CPU/GPU/ANE channel among ['SOC_A']" in (r.unavailable or "")
    assert energy_reading([], 0.0).unavailable.startswith("measuring")


def test_rapl_counter_wraparound():
    assert counter_delta(100, 250, 1000) == 150
    assert counter_delta(900, 50, 1000) == 150  # wrapped past max_energy_range_uj
    total, cpu = rapl_watts({"z0": 262_143_000_000}, {"z0": 9_000_000},
                            {"z0": 262_143_328_850}, {"z0": "package-0"}, 1.0)
    assert total == cpu == pytest.approx(9.32885)


def test_rapl_psys_is_the_total_and_packages_the_cpu():
    names = {"intel-rapl:0": "package-0", "intel-rapl:1": "psys", "intel-rapl:2": "package-1"}
    prev = dict.fromkeys(names, 0)
    cur = {"intel-rapl:0": 20_000_000, "intel-rapl:1": 60_000_000, "intel-rapl:2": 10_000_000}
    assert rapl_watts(prev, cur, {}, names, 2.0) == (30.0, 15.0)
    del cur["intel-rapl:1"]  # a CPU without a psys zone: the packages are the total
    assert rapl_watts(prev, cur, {}, names, 2.0) == (15.0, 15.0)


def powercap(root: Path, zones: dict[str, tuple[str, int]]) -> None:
    """The sysfs layout of /sys/class/powercap (recorded from a Linux x86 box), in tmp_path."""
    for zone, (name, energy) in zones.items():
        d = root / zone
        d.mkdir(parents=True)
        (d / "name").write_text(name + "\n")
        (d / "energy_uj").write_text(f"{energy}\n")
        (d / "max_energy_range_uj").write_text("262143328850\n")
        (d / "enabled").write_text("1\n")


def test_rapl_source_two_samples_give_watts(tmp_path: Path):
    powercap(tmp_path, {"intel-rapl:0": ("package-0", 1_000_000),
                        "intel-rapl:0:0": ("core", 500_000),       # subzone: not summed
                        "intel-rapl:0:1": ("dram", 200_000),
                        "intel-rapl-mmio:0": ("package-0", 7)})    # another interface
    clock = iter([100.0, 102.0]).__next__
    src = RaplSource(tmp_path, clock=clock)
    assert list(src.zones) == ["intel-rapl:0"]
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("51000000\n")
    r = src.read()
    assert (r.watts, r.cpu_watts, r.source) == (25.0, 25.0, "rapl")


def test_unreadable_rapl_says_root_is_needed(tmp_path: Path):
    powercap(tmp_path, {"intel-rapl:0": ("package-0", 1)})

    def denied(p: Path) -> str:
        raise PermissionError(13, "Permission denied", str(p))
    r = RaplSource(tmp_path, read=denied).read()
    assert r.watts is None and r.unavailable == RAPL_UNREADABLE
    assert "without root" in RAPL_UNREADABLE and "/sys/class/powercap" in RAPL_UNREADABLE
    r = RaplSource(tmp_path / "nothing").read()
    assert "no RAPL counters" in (r.unavailable or "")


class FakeNvml:
    """Stands in for libnvidia-ml.so.1: same calls, same out-parameters, values in mW."""

    def __init__(self, milliwatts: list[int | None], init_rc: int = 0):
        self.mw, self.init_rc, self.shut = milliwatts, init_rc, False

    def nvmlInit_v2(self) -> int:
        return self.init_rc

    def nvmlDeviceGetCount_v2(self, count) -> int:
        count._obj.value = len(self.mw)
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index: ctypes.c_uint, handle) -> int:
        handle._obj.value = 0x1000 + index.value
        return 0

    def nvmlDeviceGetPowerUsage(self, handle: ctypes.c_void_p, mw) -> int:
        v = self.mw[(handle.value or 0) - 0x1000]
        if v is None:
            return 3  # NVML_ERROR_NOT_SUPPORTED
        mw._obj.value = v
        return 0

    def nvmlShutdown(self) -> int:
        self.shut = True
        return 0


def test_nvml_sums_gpus_in_watts():
    lib = FakeNvml([412_345, 398_000, None])
    src = NvmlSource(lib)
    r = src.read()
    assert r.gpu_watts == r.watts == pytest.approx(810.345) and r.source == "nvml"
    src.close()
    assert lib.shut


def test_nvml_missing_or_failing_is_a_reason():
    assert "NVML not found" in (NvmlSource(name="libnvidia-ml-shoal-missing.so.1").read()
                                .unavailable or "")
    assert "error 9" in (NvmlSource(FakeNvml([1], init_rc=9)).read().unavailable or "")
    assert "no NVIDIA GPU" in (NvmlSource(FakeNvml([])).read().unavailable or "")
    assert "don't report power" in (NvmlSource(FakeNvml([None])).read().unavailable or "")


def test_linux_power_combines_what_is_there():
    cpu = Unavailable(RAPL_UNREADABLE)
    both = LinuxPower(cpu, NvmlSource(FakeNvml([300_000]))).read()
    assert (both.watts, both.cpu_watts, both.gpu_watts, both.source) == (300.0, None, 300.0,
                                                                          "nvml")
    neither = LinuxPower(cpu, Unavailable("unavailable: NVML not found")).read()
    assert neither.watts is None
    assert neither.unavailable == f"{RAPL_UNREADABLE}; unavailable: NVML not found"


def test_default_source_here_never_raises():
    r = default_source("linux").read()
    assert isinstance(r, PowerReading) and (r.watts is not None or r.unavailable)
    assert "no power source for" in (default_source("win32").read().unavailable or "")
    # On Linux there is no libIOReport: the macOS source fails soft.
    assert "failed to start" in (default_source("darwin").read().unavailable or "")


class Counting:
    def __init__(self) -> None:
        self.n, self.closed = 0, False

    def read(self) -> PowerReading:
        self.n += 1
        return PowerReading(float(self.n), source="fake", at=time.time())

    def close(self) -> None:
        self.closed = True


def test_sampler_keeps_the_last_reading():
    src = Counting()
    s = PowerSampler(lambda: src, interval=0.02).start()
    try:
        assert s.latest().unavailable or s.latest().watts
        wait_until(lambda: (s.latest().watts or 0) >= 3, timeout=10)
    finally:
        s.stop()
    assert src.closed


def test_sampler_never_blocks_on_a_hung_source():
    release = threading.Event()

    class Hung(Counting):
        def read(self) -> PowerReading:
            release.wait(30)
            return super().read()
    s = PowerSampler(Hung, interval=0.01, stale_after=0.3).start()
    try:
        t0 = time.monotonic()
        first = s.latest()
        assert time.monotonic() - t0 < 0.1 and first.unavailable.startswith("measuring")
        wait_until(lambda: "stopped answering" in (s.latest().unavailable or ""), timeout=10)
    finally:
        release.set()
        s.stop()


def test_sampler_reports_a_source_that_fails():
    def boom() -> Counting:
        raise OSError("IOReport refused the Energy Model subscription")
    s = PowerSampler(boom, interval=0.01).start()
    try:
        wait_until(lambda: "failed to start" in (s.latest().unavailable or ""), timeout=10)
    finally:
        s.stop()
    assert missing("x").to_json()["unavailable"] == "x"
    assert PowerReading(1.23456, source="rapl").rounded().watts == 1.23


def test_the_sampler_keeps_what_the_node_drew_while_it_generated():
    # a scripted source: this machine has no RAPL, NVML or IOReport to read
    busy = threading.Event()
    src = Counting()  # 1 W, 2 W, 3 W, ... one more at each reading
    s = PowerSampler(lambda: src, interval=0.01, busy=busy.is_set, keep=3).start()
    try:
        wait_until(lambda: src.n >= 3, timeout=10)
        assert s.serving_watts() is None  # idle readings don't count
        busy.set()
        wait_until(lambda: s.serving_watts() is not None, timeout=10)
        busy.clear()
        n = src.n
        wait_until(lambda: src.n >= n + 3, timeout=10)
        kept = s.serving_watts()
        assert kept is not None and 3 < kept < n + 1  # busy readings only, the last 3
    finally:
        s.stop()
