"""Memory and machine facts from recorded /proc files and macOS sysctl output
(tests/fixtures/linux/, tests/fixtures/macos/machine/; see their READMEs), and Metal's own
working-set figures captured on real Macs (tests/fixtures/macos/captured/sysctl/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.telemetry import memory
from engine.telemetry.memory import (
    GB,
    MemoryInfo,
    mac_gpu_budget,
    mac_gpu_name,
    machine_info,
    memory_info,
    nvidia_gpu_names,
    parse_cpuinfo,
    parse_meminfo,
    parse_os_release,
)

FIX = Path(__file__).resolve().parents[2] / "fixtures"


def recorded_sysctl(name: str):
    """A sysctl callable answering from `sysctl a b c` output recorded on a Mac."""
    values = dict(line.split(": ", 1) for line in
                  (FIX / "macos/machine" / name).read_text().splitlines() if ": " in line)
    return lambda key: values.get(key)


def test_linux_meminfo():
    m = parse_meminfo((FIX / "linux/proc_meminfo.txt").read_text())
    assert m == MemoryInfo(65536000 * 1024, 41234567 * 1024, "MemAvailable from /proc/meminfo")
    old = parse_meminfo((FIX / "linux/proc_meminfo_no_memavailable.txt").read_text())
    assert old.available_bytes == (500000 + 100000 + 400000) * 1024
    assert "no MemAvailable" in old.rule


@pytest.mark.parametrize("text", ["", "garbage\n\x00", "MemAvailable: 12 kB\n"])
def test_unreadable_meminfo_says_why(text: str):
    m = parse_meminfo(text)
    assert m.total_bytes is None and m.unavailable and "MemTotal" in m.unavailable


def test_memory_info_reads_the_file_or_says_why(tmp_path: Path):
    f = tmp_path / "meminfo"
    f.write_text((FIX / "linux/proc_meminfo.txt").read_text())
    assert memory_info("linux", meminfo=f).available_bytes == 41234567 * 1024
    gone = memory_info("linux", meminfo=tmp_path / "nope")
    assert gone.unavailable and "can't read" in gone.unavailable


def test_mac_gpu_budget_rules():
    assert mac_gpu_budget(512 * GB, 400 * GB, 0) == (400 * GB,
                                                     "Metal max_recommended_working_set_size")
    assert mac_gpu_budget(24 * GB, None, 20480) == (20 * GB, "iogpu.wired_limit_mb sysctl")
    small, rule = mac_gpu_budget(32 * GB, None, None)
    assert small == pytest.approx(21.33 * GB, rel=1e-3) and "2/3 of RAM" in rule
    big, rule = mac_gpu_budget(192 * GB, None, 0)
    assert big == pytest.approx(161.28 * GB, rel=1e-3) and "84% of RAM" in rule
    assert mac_gpu_budget(36 * GB, None, None)[0] == 24 * GB  # 36 GB is still "small"


def test_without_metal_the_budget_is_what_metal_recommends_on_real_macs():
    samples = [json.loads(line) for line in
               (FIX / "macos/captured/sysctl/mlx_device_info_samples.jsonl").read_text()
               .splitlines() if line.strip()]
    assert len(samples) == 2
    for s in samples:
        metal = s.get("max_recommended_working_set_size") or \
            s["max_recommended_working_set_size_mb"] * 1024 * 1024
        budget, rule = mac_gpu_budget(s["memory_size"], None, None)
        assert budget == pytest.approx(metal, rel=1e-3), s["src"]
        total = s["memory_size"]  # the old rule promised more than Metal gives:
        assert budget < (total * 0.75 if total <= 36 * GB else total - 8 * GB)
    assert mac_gpu_budget(16 * GB, None, None)[0] / GB == pytest.approx(10.67, abs=0.01)
    assert mac_gpu_budget(128 * GB, None, None)[0] / GB == pytest.approx(107.5, abs=0.03)


def test_macos_memory_from_recorded_sysctl(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(memory, "metal_working_set", lambda: None)  # no Metal on Linux
    m = memory_info("darwin", sysctl=recorded_sysctl("sysctl_m3_ultra_512gb.txt"))
    assert (m.total_bytes, m.free_percent) == (512 * GB, 91)
    assert m.available_bytes == int(512 * GB * 0.84)
    assert "Metal's default: 84% of RAM" in m.rule  # wired_limit_mb 0 means "the default"
    m = memory_info("darwin", sysctl=recorded_sysctl("sysctl_m4_24gb_wired_limit.txt"))
    assert (m.available_bytes, m.rule) == (20 * GB, "iogpu.wired_limit_mb sysctl")
    monkeypatch.setattr(memory, "metal_working_set", lambda: 380 * GB)
    m = memory_info("darwin", sysctl=recorded_sysctl("sysctl_m3_ultra_512gb.txt"))
    assert (m.available_bytes, m.rule) == (380 * GB, "Metal max_recommended_working_set_size")
    broken = memory_info("darwin", sysctl=lambda key: None)
    assert broken.unavailable and "hw.memsize" in broken.unavailable


def test_no_metal_here_means_no_working_set():
    assert memory.metal_working_set() is None  # mlx[cpu]: Metal unavailable, no crash


def test_chip_os_and_gpu_names():
    assert parse_cpuinfo((FIX / "linux/proc_cpuinfo_x86.txt").read_text()) == \
        "AMD EPYC 7763 64-Core Processor"
    assert parse_cpuinfo((FIX / "linux/proc_cpuinfo_arm.txt").read_text()) == \
        "Raspberry Pi 4 Model B Rev 1.4"
    assert parse_cpuinfo("garbage") is None
    assert parse_os_release((FIX / "linux/etc_os-release.txt").read_text()) == \
        "Ubuntu 24.04.1 LTS"
    assert mac_gpu_name((FIX / "macos/machine/system_profiler_SPDisplaysDataType.json")
                        .read_text()) == "Apple M3 Ultra (80-core GPU)"
    assert mac_gpu_name("{not json") is None and mac_gpu_name("[]") is None
    assert mac_gpu_name('{"SPDisplaysDataType": [{"sppci_model": "Apple M4"}]}') == "Apple M4"


def test_nvidia_gpu_names_from_recorded_proc(tmp_path: Path):
    for i in (0, 1):
        d = tmp_path / f"0000:{i:02x}:00.0"
        d.mkdir()
        (d / "information").write_text(
            (FIX / "linux/proc_driver_nvidia_gpus_information.txt").read_text())
    assert nvidia_gpu_names(tmp_path) == ["NVIDIA H200", "NVIDIA H200"]
    assert nvidia_gpu_names(tmp_path / "none") == []


def test_machine_info_here():
    info = machine_info("linux")
    assert info.mlx_backend == "cpu" and info.mlx_version
    assert info.memory.total_bytes and info.memory.available_bytes
    assert info.os_name and info.os_version
    d = info.to_json()
    assert d["memory"]["rule"] == "MemAvailable from /proc/meminfo"
