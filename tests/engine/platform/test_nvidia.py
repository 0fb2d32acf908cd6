"""The NVIDIA probe against output real cards printed (tests/fixtures/nvidia-smi/, see its
README), hostile and odd output, and a real `nvidia-smi` stand-in process that answers,
fails or hangs."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from engine.node.topology import topology_info
from engine.platform.nvidia import (
    COMMAND,
    FIELDS,
    MIB,
    NvidiaGpu,
    NvidiaReport,
    cuda_gpu_budget,
    parse_query_csv,
    probe_nvidia,
)
from engine.platform.probes import run_command
from engine.records import MachineInfo, NodeInfo

SMI = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-smi"
GIB = 1024 ** 3


def recorded(name: str) -> NvidiaReport:
    return parse_query_csv((SMI / name).read_text())


@pytest.mark.parametrize("name, card, mib, driver, cap, watts, mig", [
    ("h100-80gb-hbm3.csv", "NVIDIA H100 80GB HBM3", 81559, "590.48.01", "9.0", (69.85, 700.0),
     False),
    ("h100-mig.csv", "NVIDIA H100 80GB HBM3", 81559, "590.48.01", "9.0", (71.15, 700.0), True),
    ("h200.csv", "NVIDIA H200", 143771, "590.48.01", "9.0", (77.71, 700.0), False),
    ("l40s.csv", "NVIDIA L40S", 46068, "595.80", "8.9", (144.97, 350.0), None),
    ("rtx-4080-super.csv", "NVIDIA GeForce RTX 4080 SUPER", 16376, "595.71.05", "8.9",
     (26.2, 320.0), None),
])
def test_recorded_cards(name, card, mib, driver, cap, watts, mig):
    report = recorded(name)
    assert report.unavailable is None
    (gpu,) = report.gpus
    assert gpu.name == card and gpu.memory_total_bytes == mib * MIB
    assert gpu.driver == driver and gpu.compute_capability == cap
    assert (gpu.power_draw_watts, gpu.power_limit_watts) == watts
    assert gpu.mig is mig  # "[N/A]" on cards without MIG
    assert gpu.memory_used_bytes is not None and gpu.memory_used_bytes < gpu.memory_total_bytes


def test_dgx_spark_unified_memory_has_no_vram_figure():
    (gpu,) = recorded("gb10-dgx-spark.csv").gpus
    assert gpu.name == "NVIDIA GB10" and gpu.memory_total_bytes is None
    assert gpu.driver is None and gpu.compute_capability is None  # not asked for there
    assert cuda_gpu_budget([gpu]) is None  # its memory is the system's: MemAvailable stays


def test_vram_budget_is_90_percent_of_the_gpus_memory():
    (h100,) = recorded("h100-80gb-hbm3.csv").gpus
    usable, rule = cuda_gpu_budget([h100])
    assert usable == int(81559 * MIB * 0.9) and "VRAM" in rule and "H100" in rule
    # MLX's own figure (CUDA_VISIBLE_DEVICES, a MIG slice) wins over nvidia-smi's card
    usable, rule = cuda_gpu_budget([h100], mlx_total=10 * GIB)
    assert usable == 9 * GIB and "MLX" in rule


def test_noheader_output_in_the_probes_field_order():
    row = "NVIDIA H100 80GB HBM3, 81559, 0, 590.48.01, 9.0, 69.85, 700.00, Disabled"
    assert len(row.split(",")) == len(FIELDS)
    (gpu,) = parse_query_csv(row + "\n").gpus
    assert gpu.memory_total_bytes == 81559 * MIB and gpu.power_limit_watts == 700.0


def test_two_cards_and_not_supported_fields():
    text = ("name, memory.total [MiB], memory.used [MiB], driver_version, compute_cap, "
            "power.draw [W], power.limit [W]\n"
            "NVIDIA GeForce RTX 4090, 24564, 507, 550.163.01, 8.9, [Not Supported], 450.00\n"
            "NVIDIA GeForce RTX 4090, [Unknown Error], 459, 550.163.01, 8.9, 21.00, 450.00\n")
    a, b = parse_query_csv(text).gpus
    assert a.power_draw_watts is None and a.memory_total_bytes == 24564 * MIB
    assert b.memory_total_bytes is None and b.power_draw_watts == 21.0
    assert cuda_gpu_budget([a, b])[0] == int(24564 * MIB * 0.9)  # MLX uses the first


@pytest.mark.parametrize("text", [
    "", "\n\n", "No devices were found\n", "\x00\xff garbage \x1b[31m\n",
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
    "name, memory.total [MiB]\n, 24564\n[N/A], 1\n",
    "a,b\n" * 100_000,
])
def test_hostile_output_gives_a_reason_not_a_crash(text: str):
    report = parse_query_csv(text)
    assert report.gpus == () and report.unavailable and report.unavailable.startswith(
        "unavailable:")


def test_absurd_values_never_crash():
    text = ("name, memory.total [MiB], compute_cap, driver_version\n"
            + "X" * 10_000 + ", -5, 9.0; rm -rf /, " + "9" * 500 + "\n")
    (gpu,) = parse_query_csv(text).gpus
    assert len(gpu.name) == 200 and gpu.memory_total_bytes is None
    assert gpu.compute_capability is None and gpu.driver is not None and len(gpu.driver) <= 40


def test_report_json_round_trip_and_a_peers_garbage():
    report = recorded("h100-80gb-hbm3.csv")
    assert NvidiaReport.from_json(report.to_json()) == report
    assert NvidiaReport.from_json(None).unavailable
    odd = NvidiaReport.from_json({"gpus": [{"name": 3}, {"name": "A", "memory_total_bytes":
                                                         "lots", "mig": "yes"}, 7]})
    assert odd.gpus == (NvidiaGpu("A"),)


def test_the_topology_shows_the_gpu():
    report = recorded("rtx-4080-super.csv")
    me = NodeInfo("n1", "box", machine=MachineInfo(gpu=report.summary, mlx_backend="cuda",
                                                   nvidia=report))
    machine = topology_info(me, []).to_json()["nodes"][0]["machine"]
    assert machine["gpu"] == "NVIDIA GeForce RTX 4080 SUPER (16.0 GiB)"
    (gpu,) = machine["nvidia"]["gpus"]
    assert gpu["compute_capability"] == "8.9" and gpu["driver"] == "595.71.05"
    assert gpu["memory_total_bytes"] == 16376 * MIB
    # a peer's JSON reads back the same; a Mac's machine leaves the key out
    assert MachineInfo.from_json(machine).nvidia == report
    assert "nvidia" not in MachineInfo(gpu="Apple M3 Ultra").to_json()


# --- a real process standing in for nvidia-smi -------------------------------------------
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")


def test_the_probe_runs_the_query_and_reads_its_answer(tmp_path, monkeypatch):
    # answers only the exact command line the probe is meant to send
    fake_smi(tmp_path, monkeypatch, f'[ "$*" = "{" ".join(COMMAND[1:])}" ] || exit 9\n'
             f'cat "{SMI / "h100-80gb-hbm3.csv"}"\n')
    (gpu,) = probe_nvidia().gpus
    assert gpu.name == "NVIDIA H100 80GB HBM3"


def test_driver_failure_says_what_nvidia_smi_said(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, "echo \"NVIDIA-SMI has failed because it couldn't "
             "communicate with the NVIDIA driver.\"\nexit 9\n")
    report = probe_nvidia()
    assert report.gpus == () and "status 9" in report.unavailable
    assert "communicate with the NVIDIA driver" in report.unavailable


def test_a_hung_nvidia_smi_is_cut_off(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, "exec sleep 30\n")
    t = time.monotonic()
    report = probe_nvidia(timeout=0.5)
    assert time.monotonic() - t < 5
    assert report.gpus == () and "longer than 0.5 s" in report.unavailable


def test_no_nvidia_smi_means_no_gpus_and_why(tmp_path):
    def absent(argv, timeout):
        return run_command(["shoal-no-such-nvidia-smi", *argv[1:]], timeout)
    report = probe_nvidia(absent)
    assert report.gpus == () and "not installed" in report.unavailable
