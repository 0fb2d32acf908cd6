"""Benchmark: one request at a time through a 2-rank pipeline, lockstep (`--streams 1`) against the
batching group (`--streams 8`) serving it alone: does the batching path cost anything
when there is nothing to batch? (issue "The house, second floor": if it is within noise,
lockstep, its codec and its prefix protocol go).

Setup: 2-rank groups of worker processes (MLX ring over loopback), each rank pinned to a
core of its own; the bundled SmolLM2 (split 15/15); one greedy
request of --tokens at a time; both groups loaded side by side, rounds interleaved, same
run. Pipeline only: SmolLM2's 9 attention heads don't split over 2 ranks, and a random
model's byte vocabulary holds its text back, so its stream times say nothing. Figures:
decode tokens/s (tokens after the first over the time since the first) and
time to first token of a ~300-token prompt, medians of --rounds.

Run: .venv/bin/python benchmarks/group_one_stream.py [--tokens 48] [--rounds 5]
"""

from __future__ import annotations

import argparse
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

from dist_harness import Group, Worker  # noqa: E402

ASK = [{"role": "user", "content": "Tell a story about the sea and a lighthouse keeper. "
        * 12}]


def one(w: Worker, rid: str, tokens: int) -> tuple[float, float]:
    """(decode tokens/s, time to first token) of one request alone."""
    t0 = time.perf_counter()
    w.send({"op": "generate", "id": rid, "request": {
        "messages": ASK, "sampling": {"max_tokens": tokens, "temperature": 0}}})
    first = last = 0.0
    while True:
        ev = w.expect(lambda e: e.get("id") == rid, 600)
        now = time.perf_counter()
        if ev["ev"] == "delta":
            first = first or now
            last = now
        elif ev["ev"] == "done":  # a byte vocabulary's deltas can hold text back
            last = now
            return (ev["generation_tokens"] - 1) / (last - first), first - t0
        elif ev["ev"] == "error":
            raise RuntimeError(ev)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    from engine.hub.bundled import ensure_default_model

    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-"))
    cores = os.cpu_count() or 2
    try:
        model = ensure_default_model(tmp / "models")
        rows = []
        for strategy, layers in (("pipeline", [[0, 15], [15, 30]]),):
            groups = {}
            for streams in (1, 8):
                g = Group(tmp / f"{strategy}-{streams}", model, 2, strategy, layers=layers,
                          streams=streams, timeout_s=120,
                          prefix_cache_tokens=0)  # every round prefills its prompt
                groups[streams] = g
            for g in groups.values():
                g.ready(300)
                for r, w in enumerate(g.ranks):  # a core each, as on separate machines
                    os.sched_setaffinity(w.proc.pid, {r % cores})
            got: dict[int, list[tuple[float, float]]] = {1: [], 8: []}
            for i in range(a.rounds + 1):
                for streams, g in groups.items():
                    res = one(g.leader, f"{strategy}-{streams}-{i}", a.tokens)
                    if i:  # the first round warms up
                        got[streams].append(res)
            for g in groups.values():
                g.kill()
            med = {s: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
                   for s, v in got.items()}
            rows.append((strategy, med[1], med[8]))
        print("| group | lockstep tokens/s | batching tokens/s | ratio | lockstep TTFT s "
              "| batching TTFT s |")
        print("|---|---|---|---|---|---|")
        for strategy, lock, batch in rows:
            print(f"| 2-rank {strategy} | {lock[0]:.1f} | {batch[0]:.1f} | "
                  f"{batch[0] / lock[0]:.2f} | {lock[1]:.2f} | {batch[1]:.2f} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
