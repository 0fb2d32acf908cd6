"""Benchmark: prefill of one long prompt through a pipeline, its chunks overlapping across
the stages (the batching group: rank 1 runs chunk i while rank 0 runs chunk i+1) against
the same pipeline one stage after the other (lockstep, `--streams 1`: each chunk crosses
every rank before the next starts). Issue "What users wait for", goal >= 1.6x on 2 ranks.

Setup: groups of worker processes (MLX ring over loopback) serving the bundled SmolLM2
(30 layers, split evenly), the prefix cache off so every round prefills; each rank's
threads pinned to a core of its own where the machine has enough (on 2 cores, a 3-rank
pipeline's ranks share them, and its row says so). One greedy request with a prompt of
--words words (about 1.3 tokens a word) and 2 answer tokens; prefill tokens/s = prompt
tokens / time to first token. Both modes are loaded side by side and their rounds
interleaved; medians of --rounds after a warm-up.

Run: .venv/bin/python benchmarks/pipelined_prefill.py [--words 1500] [--rounds 3]
     [--ranks 2 3]
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

SPLITS = {2: [[0, 15], [15, 30]], 3: [[0, 10], [10, 20], [20, 30]]}
MODES = {"lockstep": 1, "pipelined": 8}  # --streams


def pin(pid: int, core: int) -> None:
    """Every thread of the process on one core (a process's affinity is per thread)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), {core})
        except OSError:
            pass  # a thread that just ended


def prefill(w: Worker, rid: str, words: int) -> tuple[int, float]:
    """(prompt tokens, seconds to the first token) of one request."""
    text = " ".join(f"word{i % 97}" for i in range(words))
    t0 = time.perf_counter()
    w.send({"op": "generate", "id": rid, "request": {
        "messages": [{"role": "user", "content": text}],
        "sampling": {"max_tokens": 2, "temperature": 0}}})
    first = 0.0
    while True:
        ev = w.expect(lambda e: e.get("id") == rid, 900)
        if ev["ev"] in ("delta", "done") and not first:
            first = time.perf_counter() - t0
        if ev["ev"] == "done":
            return ev["prompt_tokens"], first
        if ev["ev"] == "error":
            raise RuntimeError(ev)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--words", type=int, default=1500)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 3])
    a = p.parse_args()
    from engine.hub.bundled import ensure_default_model

    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-"))
    cores = os.cpu_count() or 2
    rows = []
    try:
        model = ensure_default_model(tmp / "models")
        for world in a.ranks:
            groups = {mode: Group(tmp / f"{world}-{mode}", model, world, "pipeline",
                                  layers=SPLITS[world], streams=streams, timeout_s=300,
                                  prefix_cache_tokens=0)
                      for mode, streams in MODES.items()}
            for g in groups.values():
                g.ready(300)
                for r, w in enumerate(g.ranks):
                    pin(w.proc.pid, r % cores)
            got: dict[str, list[float]] = {m: [] for m in groups}
            n = 0
            for i in range(a.rounds + 1):
                for mode, g in groups.items():
                    n, s = prefill(g.leader, f"{world}-{mode}-{i}", a.words)
                    if i:  # the first round warms up
                        got[mode].append(n / s)
            for g in groups.values():
                g.kill()
            med = {m: statistics.median(v) for m, v in got.items()}
            rows.append((world, n, med, got, world > cores))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("| pipeline | prompt tokens | one stage after the other | pipelined | ratio |")
    print("|---|---|---|---|---|")
    for world, n, med, got, shared in rows:
        lock, pipe = med["lockstep"], med["pipelined"]
        print(f"| {world} ranks{' (sharing ' + str(cores) + ' cores)' if shared else ''} "
              f"| {n} | {lock:.1f} tok/s ({', '.join(f'{x:.1f}' for x in got['lockstep'])})"
              f" | {pipe:.1f} tok/s ({', '.join(f'{x:.1f}' for x in got['pipelined'])}) "
              f"| {pipe / lock:.2f}x |")


if __name__ == "__main__":
    main()
