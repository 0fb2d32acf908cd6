"""What TLS between nodes costs: a chat answered through the node that doesn't own the
model (relayed over the cluster port to its owner, streamed back token by token) with the
cluster's TLS on and off, and the same chat asked of the owner directly, in one run.

Run: .venv/bin/python benchmarks/cluster_tls.py [--model smollm2] [--tokens 64] [--rounds 5]
Two nodes on loopback hold a 2-rank pipeline of the model (rank 0 on node A, its owner);
each round asks A directly and B (relayed to A), streaming, greedy. The clusters with TLS
on and off are started in turn twice (on, off, on, off), so drift over the run falls on
both. Prints a markdown table; docs/benchmarks.md ("TLS between nodes") keeps the last
run's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from nodes import NodeProcess, start_cluster  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper."


def model_dir(kind: str, tmp: Path) -> Path:
    if kind == "smollm2":
        from engine.hub.bundled import ensure_default_model
        return ensure_default_model(tmp / "models")
    from tiny import LLAMA, make_tiny_model
    return make_tiny_model(tmp / "tiny-llama", LLAMA, num_hidden_layers=6)


def one_chat(node: NodeProcess, model: str, tokens: int) -> tuple[float, float]:
    """(time to first token, decode tokens/s) as a streaming client sees them."""
    import httpx
    t0 = time.perf_counter()
    stamps: list[float] = []
    with httpx.stream("POST", node.url + "/v1/chat/completions", timeout=600, json={
            "model": model, "max_tokens": tokens, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": PROMPT}]}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    stamps.append(time.perf_counter())
    return stamps[0] - t0, (len(stamps) - 1) / (stamps[-1] - stamps[0])


def measure(tmp: Path, model: Path, tls: bool, rounds: int, tokens: int
            ) -> dict[str, list[tuple[float, float]]]:
    env = {} if tls else {"SHOAL_CLUSTER_TLS": "off"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        a, b = start_cluster(tmp / f"cluster-{'tls' if tls else 'clear'}-{time.time_ns()}",
                             model, 2)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    try:
        import httpx
        ids = [n.client.status().cluster.id for n in (a, b)]
        layers = json.loads((model / "config.json").read_text())["num_hidden_layers"]
        r = httpx.post(a.url + "/shoal/instances", timeout=600, json={
            "model": model.name, "strategy": "pipeline",
            "nodes": [{"node": ids[0], "layers": [0, layers // 2]},
                      {"node": ids[1], "layers": [layers // 2, layers]}]})
        r.raise_for_status()
        one_chat(a, model.name, 8)  # warm both paths (and the relay's pooled connection)
        one_chat(b, model.name, 8)
        out: dict[str, list[tuple[float, float]]] = {"direct": [], "relayed": []}
        for _ in range(rounds):
            out["direct"].append(one_chat(a, model.name, tokens))
            out["relayed"].append(one_chat(b, model.name, tokens))
        return out
    finally:
        a.stop()
        b.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2", choices=("smollm2", "tiny-llama"))
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="shoal-tls-"))
    model = model_dir(args.model, tmp)
    got: dict[tuple[bool, str], list[tuple[float, float]]] = {}
    for tls in (True, False, True, False):
        for path, runs in measure(tmp, model, tls, args.rounds, args.tokens).items():
            got.setdefault((tls, path), []).extend(runs)
    print(f"{args.model}, {args.tokens} tokens, {2 * args.rounds} rounds per row "
          f"(median), 2-rank pipeline on loopback\n")
    print("| path | cluster TLS | time to first token | decode tok/s |")
    print("|---|---|---|---|")
    for path in ("direct", "relayed"):
        for tls in (True, False):
            runs = got[(tls, path)]
            ttft = statistics.median(r[0] for r in runs)
            tps = statistics.median(r[1] for r in runs)
            print(f"| {path} | {'on' if tls else 'off'} | {ttft * 1000:.0f} ms | {tps:.1f} |")


if __name__ == "__main__":
    main()
