"""A CUDA node's memory is its GPU's VRAM: `shoal plan --simulate` with a Mac and an RTX 4090
box, and a live node whose MLX runs on CUDA (its memory facts as the planner reads them)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from engine import placement_profiles
from engine.node.planning import planner_node
from engine.placement.profiles import parse_simulation
from engine.placement_cli import add_plan_parser
from engine.platform.nvidia import MIB, cuda_gpu_budget, parse_query_csv
from engine.records import MachineInfo, NodeInfo
from engine.telemetry.memory import memory_info

FIX = Path(__file__).resolve().parents[2] / "fixtures"
GIB = 1024 ** 3


def mac_and_pc(pc: dict) -> dict:
    return {"nodes": [{"name": "mac", "profile": "mac-mini-m4", "memory_gb": 16}, pc],
            "links": [{"a": "mac", "b": "pc", "preset": "10gbe"}]}


RTX_4090 = {"name": "pc", "profile": "rtx-4090"}
RAM_64 = {"name": "pc", "usable_gb": 60, "bandwidth_gbs": 80, "tflops": 2}  # CPU box


def plan(tmp_path: Path, sim: dict, *argv: str) -> tuple[int, dict | str]:
    path = tmp_path / "sim.json"
    path.write_text(json.dumps(sim))
    parser = argparse.ArgumentParser(prog="shoal")
    add_plan_parser(parser.add_subparsers())
    a = parser.parse_args(["plan", *argv, "--simulate", str(path)])
    return a.func(a), a


def test_the_4090_node_counts_its_vram(tmp_path):
    sim = parse_simulation(mac_and_pc(RTX_4090), placement_profiles.machines(),
                           placement_profiles.models())
    pc = next(n for n in sim.nodes if n.name == "pc")
    assert pc.memory_bytes == int(24 * GIB * 0.9)  # MLX_CUDA_FRACTION
    assert pc.memory_bandwidth_Bps == 1008e9 and pc.compute_flops == 165.2e12
    assert not pc.unpacks  # a GPU keeps quantized weights packed


def test_places_a_model_that_fits_24_gb_of_vram(tmp_path, capsys):
    rc, _ = plan(tmp_path, mac_and_pc(RTX_4090), "Qwen3-30B-A3B", "--quant", "4bit",
                 "--context", "8192", "--json")
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    alone = [p for p in doc["placements"] if [r["name"] for r in p["ranks"]] == ["pc"]]
    assert alone, "the 4090 holds the 17 GB model by itself"
    assert alone[0]["ranks"][0]["memory"]["usable"] == int(24 * GIB * 0.9)


@pytest.mark.parametrize("pc, fits", [(RTX_4090, False), (RAM_64, True)])
def test_refuses_a_model_that_fits_only_system_ram(tmp_path, capsys, pc, fits):
    # Llama 3.3 70B at 4 bits is ~40 GB: a 64 GB box's RAM holds it, a 4090's VRAM doesn't
    rc, _ = plan(tmp_path, mac_and_pc(pc), "Llama-3.3-70B", "--quant", "4bit",
                 "--context", "8192")
    out = capsys.readouterr().out
    assert rc == (0 if fits else 1)
    if not fits:
        assert "pc has 23.2 GB usable" in out  # its VRAM; the RAM would have held it


def test_a_live_cuda_node_reports_vram_to_the_planner(tmp_path):
    (card,) = parse_query_csv((FIX / "nvidia-smi/rtx-4080-super.csv").read_text()).gpus
    meminfo = FIX / "linux/proc_meminfo.txt"  # 62.5 GiB of RAM, 39 GiB available
    mem = memory_info("linux", meminfo=meminfo, cuda=lambda: cuda_gpu_budget([card]))
    assert mem.available_bytes == int(16376 * MIB * 0.9) and "VRAM" in mem.rule
    assert mem.total_bytes == 65536000 * 1024  # the machine's RAM is still told
    node = planner_node(NodeInfo("n", "pc", machine=MachineInfo(mlx_backend="cuda",
                                                                 memory=mem)))
    assert node["memory_usable_bytes"] == int(16376 * MIB * 0.9)
    # MLX on the CPU (no CUDA budget): the system's MemAvailable, as before
    cpu = memory_info("linux", meminfo=meminfo, cuda=lambda: None)
    assert cpu.available_bytes == 41234567 * 1024 and cpu.rule.startswith("MemAvailable")
    # a DGX Spark: nvidia-smi has no VRAM figure; without MLX's own, MemAvailable stays
    (spark,) = parse_query_csv((FIX / "nvidia-smi/gb10-dgx-spark.csv").read_text()).gpus
    assert memory_info("linux", meminfo=meminfo,
                       cuda=lambda: cuda_gpu_budget([spark])).available_bytes == 41234567 * 1024
