"""Validation of the time-to-first-token model: predicted vs measured seconds to the first
token of one prompt alone, on one worker process and on a 2-rank pipeline whose chunks
overlap (the batching group), for two prompt lengths, on this machine.

Setup: the bundled SmolLM2 (30 layers, float32 on the CPU), `--streams 8` (the node's
default, so the group's prefill is pipelined), the prefix cache off so every round
prefills. The single process runs on every core; the pipeline's ranks are pinned to a
core each (split 15/15), so each rank is predicted from a one-core calibration. The
calibration (engine/telemetry/calibrate.py) and a measured loopback hop are what the
planner is given; its efficiencies are undone, as benchmarks/plan_validation.py does.
Medians of --rounds after a warm-up.

Run: .venv/bin/python benchmarks/ttft_validation.py [--words 300 1500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "engine" / "runtime"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from dist_harness import Group, Worker  # noqa: E402
from pipelined_prefill import pin, prefill  # noqa: E402
from plan_validation import loopback_hop  # noqa: E402


def calibrate(cores: str | None) -> dict[str, float]:
    """The node's calibration, on `cores` only (taskset) or on all of them."""
    from engine.platform.cpu import worker_env
    from engine.telemetry.calibrate import _MEASURE
    cmd = [sys.executable, "-c", _MEASURE]
    out = subprocess.run((["taskset", "-c", cores] if cores else []) + cmd, env=worker_env(),
                         capture_output=True, text=True, timeout=300, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def predicted(folder: Path, world: int, cal: dict[str, float], hop: tuple[float, float],
              prompt: int) -> float:
    from engine.placement.cost import Stage, ttft_s
    from engine.placement.model import LinkSpec, ModelSpec, NodeSpec
    from engine.placement.tables import DEFAULT
    config = json.loads((folder / "config.json").read_text())
    config.pop("quantization", None)  # the CPU worker runs float32 (cpu_fast_path)
    spec = ModelSpec.from_config(config, bytes_per_param=4.0, name=folder.name)
    nodes = [NodeSpec(f"rank{i}", f"rank{i}", 20 << 30,
                      cal["memory_bandwidth_Bps"] / DEFAULT.bandwidth_efficiency,
                      cal["compute_flops"] / DEFAULT.compute_efficiency,
                      attention_flops=cal["attention_flops"],
                      prefill_flops=tuple(sorted((int(w), r) for w, r in
                                                 cal["prefill_flops"].items())))
             for i in range(world)]
    cut = [spec.layers * i // world for i in range(world + 1)]
    stages = [Stage(nd, (cut[i], cut[i + 1]), i == 0) for i, nd in enumerate(nodes)]
    ring = [LinkSpec(f"rank{i}", f"rank{(i + 1) % world}", hop[0], hop[1], False)
            for i in range(world)] if world > 1 else []
    return ttft_s(spec, "pipeline", stages, ring, prompt, overlap=world > 1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--words", type=int, nargs="+", default=[300, 1500])
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    from engine.hub.bundled import ensure_default_model

    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-"))
    cores = os.cpu_count() or 2
    rows = []
    try:
        model = ensure_default_model(tmp / "models")
        cal = {1: calibrate(None), 2: calibrate("0")}
        hop = loopback_hop()
        for k, what in ((1, "all cores"), (2, "one core")):
            print(f"calibration, {what}: {cal[k]['compute_flops'] / 1e9:.0f} GFLOP/s "
                  f"matmul, {cal[k]['attention_flops'] / 1e9:.1f} attention, "
                  f"{cal[k]['memory_bandwidth_Bps'] / 1e9:.1f} GB/s; a decoder layer's "
                  "matmuls " + ", ".join(f"{r / 1e9:.0f} at width {w}"
                                         for w, r in cal[k]["prefill_flops"].items()))
        print(f"loopback hop {hop[0] * 1e6:.0f} µs\n")
        single = Worker(["--model", str(model), "--model-id", "m", "--streams", "8",
                         "--prefix-cache-tokens", "0"], tmp / "single.log")
        group = Group(tmp / "pipe", model, 2, "pipeline", layers=[[0, 15], [15, 30]],
                      streams=8, timeout_s=300, prefix_cache_tokens=0)
        single.expect(lambda e: e["ev"] == "ready", 300)
        group.ready(300)
        if cores >= 2:
            for r, w in enumerate(group.ranks):
                pin(w.proc.pid, r % cores)
        for world, leader in ((1, single), (2, group.leader)):
            for words in a.words:
                got, n = [], 0
                for i in range(a.rounds + 1):
                    n, s = prefill(leader, f"{world}-{words}-{i}", words)
                    if i:  # the first round warms up
                        got.append(s)
                rows.append((world, n, statistics.median(got), got,
                             predicted(model, world, cal[world], hop, n)))
        single.kill()
        group.kill()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("| path | prompt tokens | predicted s | measured s (rounds) | predicted / measured |")
    print("|---|---|---|---|---|")
    for world, n, med, got, want in rows:
        path = "one process, 2 cores" if world == 1 else "2-rank pipeline, a core each"
        print(f"| {path} | {n} | {want:.2f} | {med:.2f} "
              f"({', '.join(f'{x:.2f}' for x in got)}) | {want / med:.2f} |")


if __name__ == "__main__":
    main()
