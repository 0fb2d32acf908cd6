"""Power without root: IOReport energy maths on recorded channel deltas
(tests/fixtures/macos/ioreport/), RAPL on a recorded powercap layout rebuilt in tmp_path,
NVML through a stand-in for libnvidia-ml, and the sampler's bounds."""

from __future__ import annotations

import ctypes
import json
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests_support import wait_until  # noqa: E402

from engine.telemetry.power import (RAPL_UNREADABLE, LinuxPower, NvmlSource, PowerReading,
                                    PowerSampler, RaplSource, Unavailable, channel_part,
                                    counter_delta, default_source, energy_reading, missing,
                                    rapl_watts)

IOREPORT = Path(__file__).resolve().parents[2] / "fixtures" / "macos" / "ioreport"


@pytest.mark.parametrize("name", ["m1_pro_idle_mJ.json", "m3_ultra_decode_nJ.json"])
def test_ioreport_energy_to_watts(name: str):
    rec = json.loads((IOREPORT / name).read_text())
    r = energy_reading([tuple(c) for c in rec["channels"]], rec["interval_s"])
    want = rec["expected_watts"]
    assert r.unavailable is None and r.source == "ioreport"
    assert (r.cpu_watts, r.gpu_watts, r.ane_watts, r.dram_watts, r.watts) == pytest.approx(
        (want["cpu"], want["gpu"], want["ane"], want["dram"], want["total"]))


def test_unit_labels():
    one_second = [("GPU Energy", "mJ", 1500)]
    assert energy_reading(one_second, 1.0).gpu_watts == pytest.approx(1.5)
    assert energy_reading([("GPU Energy", "uJ", 1500000)], 1.0).gpu_watts == pytest.approx(1.5)
    assert energy_reading([("GPU Energy", " nJ ", 3 * 10**9)], 2.0).gpu_watts == \
        pytest.approx(1.5)


def test_channel_names_across_generations():
    assert [channel_part(n) for n in ("CPU Energy", "DIE_1_CPU Energy", "GPU Energy",
                                      "GPU SRAM0", "ANE", "ANE0_1", "DRAM0", "PCPU3", "DISP",
                                      "ECPU")] == \
        ["cpu", "cpu", "gpu", "gpu", "ane", "ane", "dram", None, None, None]


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
    assert missing("x").to_dict()["unavailable"] == "x"
    assert PowerReading(1.23456, source="rapl").to_dict()["watts"] == 1.23
