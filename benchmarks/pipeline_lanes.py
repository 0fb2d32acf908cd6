"""Benchmark: a pipeline's stages working at once (a lane per rank) against one batch going
stage after stage, for concurrent requests.

Setup: 2-rank pipelines of worker processes (MLX ring over loopback), each rank pinned to a
core of its own, as if on its own machine (this box has two); 4 concurrent greedy requests
of --tokens each; `lanes` 1 and 2 loaded side by side, rounds interleaved, same run. Models:
the wide mixture of experts of benchmarks/distributed.py (16 experts, 2 routed per token: a
step's cost grows with its batch) and the bundled SmolLM2 (dense: a step costs nearly the
same for 4 sequences as for 2). Aggregate decode tokens/s = tokens after each request's
first over the span from the first first token to the last token; rank 0's overlapped
steps are its steps run while another lane's was on rank 1.

Run: .venv/bin/python benchmarks/pipeline_lanes.py [--tokens 48] [--rounds 3]
Prints a markdown table; docs/benchmarks.md ("Serving") keeps the figures of the last run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "engine" / "runtime"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from dist_harness import Group, Worker, generate, overlapped_steps  # noqa: E402
from distributed import make_model  # noqa: E402

ASK = [[{"role": "user", "content": f"Tell story number {i} about the sea."}] for i in range(4)]


def together(w: Worker, tag: str, tokens: int) -> float:
    """Aggregate decode tokens/s of the four requests sent at once."""
    ids = [f"{tag}-{i}" for i in range(len(ASK))]
    for rid, msgs in zip(ids, ASK):
        w.send({"op": "generate", "id": rid, "request": {
            "messages": msgs, "sampling": {"max_tokens": tokens, "temperature": 0}}})
    firsts, lasts, n, left = {}, {}, 0, set(ids)
    while left:
        ev = w.expect(lambda e: e.get("id") in left, 600)
        now = time.perf_counter()
        if ev["ev"] == "delta":
            firsts.setdefault(ev["id"], now)
            lasts[ev["id"]] = now
        elif ev["ev"] == "done":
            n += ev["generation_tokens"] - 1
            left.discard(ev["id"])
        elif ev["ev"] == "error":
            raise RuntimeError(ev)
    return n / (max(lasts.values()) - min(firsts.values()))


def measure(kind: str, tmp: Path, tokens: int, rounds: int) -> dict[str, float]:
    from engine.platform.cpu import worker_env

    folder = make_model(kind, tmp)
    n = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    groups = {lanes: Group(tmp / f"{kind}-{lanes}", folder, 2, "pipeline",
                           [[0, n // 2], [n // 2, n]], env=worker_env(), streams=4,
                           lanes=lanes) for lanes in (1, 2)}
    try:
        for g in groups.values():
            g.ready(600)
            for core, w in enumerate(g.ranks):  # a core each, like two machines
                os.sched_setaffinity(w.proc.pid, {core % os.cpu_count()})
            generate(g.leader, "warm", ASK[0], max_tokens=8)
        tps: dict[int, list[float]] = {1: [], 2: []}
        for r in range(rounds):
            for lanes, g in groups.items():
                tps[lanes].append(together(g.leader, f"r{r}", tokens))
        steps = overlapped_steps(groups[2].leader), overlapped_steps(groups[1].leader)
    finally:
        for g in groups.values():
            g.shutdown()
            g.kill()
    one, two = statistics.median(tps[1]), statistics.median(tps[2])
    return {"one": one, "two": two, "ratio": two / one, "over2": steps[0],
            "over1": steps[1]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-lanes-"))
    try:
        rows = {kind: measure(kind, tmp, args.tokens, args.rounds)
                for kind in ("wide-moe", "smollm2")}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n2-rank pipeline, a core per rank, 4 concurrent greedy requests of {args.tokens} "
          f"tokens, median of {args.rounds} interleaved rounds.\n")
    print("| model | 1 lane tokens/s | 2 lanes tokens/s | 2 lanes / 1 | rank 0 steps "
          "overlapped (1 lane, 2 lanes) |")
    print("|---|---|---|---|---|")
    for kind, r in rows.items():
        print(f"| {kind} | {r['one']:.1f} | {r['two']:.1f} | {r['ratio']:.2f} | "
              f"{r['over1']}, {r['over2']} |")


if __name__ == "__main__":
    main()
