"""Simulated predictions for large models on 1, 2 and 4 M3 Ultra Mac Studios (the first
two with 512 GB, the others with 256 GB): one Mac alone, pipeline over Thunderbolt 5 TCP
(ring backend) and tensor parallel over Thunderbolt 5 RDMA (jaccl).

Pure arithmetic from the shipped profiles (resources/profiles/), no hardware needed.
Run: .venv/bin/python benchmarks/placement_table.py [--context 32768] [--wired-fraction F]
Prints a markdown table; docs/placement.md keeps the table of the last run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine import placement_profiles  # noqa: E402
from engine.placement.memory import context_label  # noqa: E402
from engine.placement.planner import Placement, evaluate  # noqa: E402
from engine.placement.profiles import links_from, node_from, profile_model  # noqa: E402
from engine.placement.validate import PlacementError  # noqa: E402

MODELS = [("Qwen3-235B-A22B", "8bit"), ("DeepSeek-V3.1", "4bit"), ("DeepSeek-V3.1", "8bit"),
          ("Kimi-K2", "4bit")]
MEMORY_GB = [512, 512, 256, 256]
SETUPS = [(1, "single", "ring", "1 Mac"),
          (2, "pipeline", "ring", "pipeline, TB5 TCP"), (2, "tensor", "jaccl", "tensor, TB5 RDMA"),
          (4, "pipeline", "ring", "pipeline, TB5 TCP"), (4, "tensor", "jaccl", "tensor, TB5 RDMA")]


def cluster(wired_fraction: float | None):
    machines = placement_profiles.machines()
    frac = {"wired_fraction": wired_fraction} if wired_fraction else {}
    nodes = [node_from({"name": f"studio-{i + 1}", "profile": "mac-studio-m3-ultra",
                        "memory_gb": gb, "rdma": True, **frac},
                       f"nodes[{i}]", machines) for i, gb in enumerate(MEMORY_GB)]
    links = links_from({"mesh": "thunderbolt5-rdma"}, "links[0]", machines,
                       [nd.id for nd in nodes])
    return nodes, links


def row(p: Placement | str, model: str, macs: int, how: str) -> str:
    if isinstance(p, str):
        return f"| {model} | {macs} | {how} | {p} | – | – | – |"
    worst = max(p.ranks, key=lambda r: r.memory.total / r.memory.usable)
    mem = " / ".join(f"{r.memory.total / 1e9:.0f}" for r in p.ranks)
    split = "" if p.strategy != "pipeline" else \
        " (layers " + ", ".join(f"{r.layers[1] - r.layers[0]}" for r in p.ranks) + ")"
    return (f"| {model} | {macs} | {how} | {mem}{split}; fullest "
            f"{100 * worst.memory.total / worst.memory.usable:.0f}% | "
            f"{p.decode_tps:.1f} | {p.prediction.decode_tps_full:.1f} | "
            f"{p.prefill_tps:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--wired-fraction", type=float, default=None,
                    help="of RAM the GPU may use (default: Metal's default working set, as "
                         "the node's probe counts it)")
    a = ap.parse_args()
    nodes, links = cluster(a.wired_fraction)
    profiles = placement_profiles.models()["models"]
    ctx = context_label(a.context)
    share = nodes[0].memory_bytes / (512 * 2**30)
    print(f"Context {ctx}; GPU may use {share:.0%} of each Mac's memory "
          f"({nodes[0].memory_bytes / 1e9:.0f} GB of 512 GB, {nodes[2].memory_bytes / 1e9:.0f}"
          f" GB of 256 GB).\n")
    print(f"| model | Macs | how | memory per Mac, GB | decode tok/s (4k) | decode tok/s "
          f"({ctx}) | prefill tok/s |")
    print("|---|---|---|---|---|---|---|")
    for name, quant in MODELS:
        model = profile_model(profiles[name], name, quant)
        for macs, strategy, backend, how in SETUPS:
            try:
                p: Placement | str = evaluate(model, nodes, links, a.context, strategy,
                                              [nd.id for nd in nodes[:macs]], backend)
            except PlacementError as e:
                p = "doesn't fit: " + str(e).split(" (weights")[0] \
                    if "needs" in str(e) else f"can't run: {e}"
            print(row(p, model.name, macs, how))


if __name__ == "__main__":
    main()
