"""Benchmark: two replicas against one instance of the same model on the same two nodes.

Real node processes on loopback serving the bundled SmolLM2-135M-Instruct, each node (and
the workers it starts) pinned to its own core. 8 concurrent streamed chats (openai SDK,
greedy, 64 new tokens) sent to the first node, in two shapes:
- distinct prefixes: every chat its own ~130-token question;
- a shared prefix: one ~600-token system turn, then each chat's own short question.
Each shape runs a round first (other questions: the caches as a working day leaves them),
then the measured round. Three setups in one run: one node alone (one core: the prefix
hit-rate baseline), a 2-node pipeline, and two replicas (one per node). Figures:
aggregate tokens/s (all streams' tokens over the wall time), median time to first token,
and the prefix hit rate (cached over prompt tokens, summed). Goals (issue 50): replicas
at least 1.7x one instance's aggregate for distinct prefixes; for the shared prefix, a
hit rate within 5 points of one node's.

Run: .venv/bin/python benchmarks/replicas.py [--streams 8] [--tokens 64]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from nodes import NodeProcess, start_cluster  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
# one engine for every setup: a pipeline runs on MLX, so replicas do too (a Linux CPU node
# alone takes llama.cpp for a GGUF import by default, engine/node/cpu_engine.py)
os.environ.setdefault("SHOAL_CPU_ENGINE", "mlx")
TOPICS = ["ferries", "herring", "lighthouses", "tides", "sea birds", "fog", "nets", "ice",
          "whales", "storms", "harbours", "sails", "knots", "maps", "stars", "winds"]
SYSTEM = ("You answer questions about the harbour town of Kvalvik: its ferries, its fish "
          "market, its lighthouse and the people who keep them. " * 24)


def chats(n: int, shared: bool, round_: int = 0) -> list[list[dict]]:
    out = []
    for i in range(round_ * n, round_ * n + n):
        topic = TOPICS[i % len(TOPICS)]
        if shared:
            out.append([{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": f"Tell me about the {topic} ({i})."}])
        else:
            ask = (f"Question {i}: I am writing a long report on {topic} in small northern "
                   f"towns. " * 6) + f"What should the first chapter say about {topic}?"
            out.append([{"role": "user", "content": ask}])
    return out


def one(url: str, messages: list[dict], tokens: int, out: list[dict[str, Any]]) -> None:
    import openai

    oai = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=900)
    t0 = time.perf_counter()
    first, n, usage = None, 0, None
    for chunk in oai.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}):
        if chunk.usage:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            n += 1
    assert first is not None and usage is not None
    details = usage.prompt_tokens_details
    out.append({"ttft": first - t0, "tokens": usage.completion_tokens,
                "prompt": usage.prompt_tokens,
                "cached": (details.cached_tokens if details else 0) or 0})


def load(url: str, streams: int, shared: bool, tokens: int, round_: int = 1
         ) -> dict[str, float]:
    results: list[dict[str, Any]] = []
    threads = [threading.Thread(target=one, args=(url, m, tokens, results))
               for m in chats(streams, shared, round_)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    assert len(results) == streams, "a stream failed"
    return {"tps": sum(r["tokens"] for r in results) / wall,
            "ttft": statistics.median(r["ttft"] for r in results),
            "hits": sum(r["cached"] for r in results) / sum(r["prompt"] for r in results)}


def pin(node: NodeProcess, core: int) -> None:
    """The node and every worker it starts later on one core (children inherit it)."""
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > core:
        os.sched_setaffinity(node.proc.pid, {core})


def measure(url: str, streams: int, tokens: int) -> dict[str, dict[str, float]]:
    import httpx
    httpx.post(url + "/v1/chat/completions", timeout=300, json={
        "model": MODEL, "messages": [{"role": "user", "content": "warm up"}],
        "max_tokens": 4})
    out = {}
    for shape, shared in (("distinct", False), ("shared", True)):
        load(url, streams, shared, tokens, round_=0)  # the steady state: caches warm
        out[shape] = load(url, streams, shared, tokens, round_=1)
    return out


def main() -> None:
    import httpx

    from engine.hub.bundled import ensure_default_model

    p = argparse.ArgumentParser()
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-replicas-"))
    got: dict[str, dict[str, dict[str, float]]] = {}
    try:
        model = ensure_default_model(tmp / "models")
        for setup in ("one node", "one instance on two nodes (pipeline)", "two replicas"):
            nodes = start_cluster(tmp / setup.replace(" ", "-"), model, 2)
            try:
                for i, n in enumerate(nodes):
                    pin(n, i)
                a, b = nodes
                if setup == "one node":
                    body: dict[str, Any] = {"model": MODEL, "nodes": [{"node": "self"}]}
                elif setup.startswith("one instance"):
                    bid = b.client.status().cluster.id
                    body = {"model": MODEL, "strategy": "pipeline", "nodes": [
                        {"node": "self", "layers": [0, 15]},
                        {"node": bid, "layers": [15, 30]}]}
                else:
                    body = {"model": MODEL, "replicas": 2}
                r = httpx.post(a.url + "/shoal/instances", timeout=900, json=body)
                r.raise_for_status()
                if setup == "two replicas":  # both copies seen by the entry node
                    deadline = time.monotonic() + 30
                    while len(httpx.get(a.url + "/shoal/replicas", timeout=10)
                              .json()["replicas"]) < 2 and time.monotonic() < deadline:
                        time.sleep(0.5)
                got[setup] = measure(a.url, args.streams, args.tokens)
            finally:
                for n in nodes:
                    n.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{args.streams} concurrent streams, {args.tokens} new tokens, bundled "
          "SmolLM2-135M-Instruct, each node pinned to its own core, all sent to the first "
          "node.\n")
    print("| setup | prefixes | aggregate tok/s | median TTFT (s) | prefix hit rate |")
    print("|---|---|---|---|---|")
    for setup, shapes in got.items():
        for shape, f in shapes.items():
            print(f"| {setup} | {shape} | {f['tps']:.1f} | {f['ttft']:.2f} | "
                  f"{f['hits']:.1%} |")
    inst, reps = got["one instance on two nodes (pipeline)"], got["two replicas"]
    print(f"\nreplicas / one instance, distinct prefixes: "
          f"{reps['distinct']['tps'] / inst['distinct']['tps']:.2f}x aggregate (goal ≥ 1.7x); "
          f"shared prefix: {reps['shared']['tps'] / inst['shared']['tps']:.2f}x; hit rate "
          f"{reps['shared']['hits']:.1%} against one node's "
          f"{got['one node']['shared']['hits']:.1%} (goal: within 5 points)")


if __name__ == "__main__":
    main()
