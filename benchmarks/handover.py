"""Benchmark: time to first token with the prompt prefilled on another node (the KV handed
over) against prefilled where it decodes, two nodes on this machine.

Two real node processes on loopback, each pinned to its own core; node A decodes, node B
prefills for it (launched with "prefill": B). For each prompt length: time to first token
of a fresh prompt on A alone, then of another fresh prompt of the same length with the
split, in the same run; and the hand-over's size and bandwidth (what A's log says of it)
against the link's, as the nodes measured it. Both nodes have the same CPU here, so the
split can't win: what it shows is what the hand-over costs beyond the prefill there (the
frames stream while it runs: what is left is the last chunk's frames and the adopting),
which a faster prefill node (an NVIDIA GPU) must beat.

Model: the bundled SmolLM2-135M-Instruct (8,192-token context: up to ~7,900-token
prompts), or `--tiny` a random-weight 4-layer model with a 40,000-token context, for 32K.

Run: .venv/bin/python benchmarks/handover.py [--tiny] [--tokens 1000,4000,7800]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from nodes import start_cluster  # noqa: E402

WORDS = ["tide", "harbour", "ferry", "gull", "rope", "lamp", "net", "sail", "fog", "reef"]


def prompt(tokens: int, seed: int, per_word: int = 1) -> str:
    """About `tokens` tokens of text nothing before has started the same way (`per_word`:
    the tokens a word takes: 1 for SmolLM2's tokenizer, a character each for --tiny's)."""
    words = [WORDS[(i * 7 + seed) % len(WORDS)] for i in range(tokens // per_word)]
    return f"Log {seed}: " + " ".join(words)


def ttft(url: str, model: str, text: str) -> tuple[float, int, int]:
    import httpx
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=1800, json={
            "model": model, "messages": [{"role": "user", "content": text}],
            "max_tokens": 2, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {r.read()[:500]!r}")
        first, usage = None, None
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
            if first is None and delta.get("content"):
                first = time.perf_counter() - t0
            if chunk.get("usage"):
                usage = chunk["usage"]
        if first is None or not usage:
            raise RuntimeError(f"no answer: {line[:300]}")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return first, usage["prompt_tokens"], cached


def handed(log: Path) -> tuple[float, ...] | None:
    """(MB, prefill s there, last frame s after it, adopted s after that) of the last
    hand-over in A's log."""
    found = re.findall(r"prefilled by \S+: ([\d.]+) MB streamed; prefill ([\d.]+) s "
                       r"there, last frame ([\d.]+) s after it, adopted ([\d.]+) s",
                       log.read_text())
    return tuple(float(x) for x in found[-1]) if found else None


def main() -> None:
    import httpx

    p = argparse.ArgumentParser()
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--tokens", default=None)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-handover-"))
    rows: list[dict[str, Any]] = []
    try:
        if args.tiny:
            from tiny import make_tiny_model
            folder = make_tiny_model(tmp / "models" / "tiny-long", hidden_size=256,
                                     num_attention_heads=4, num_key_value_heads=2,
                                     max_position_embeddings=40000)
            model, sizes = folder.name, args.tokens or "1000,8000,32000"
            per_word = 5  # a byte tokenizer: a word and its space
        else:
            from engine.hub.bundled import ensure_default_model
            folder = ensure_default_model(tmp / "models")
            model, sizes = "SmolLM2-135M-Instruct", args.tokens or "1000,4000,7800"
            per_word = 1
        a, b = nodes = start_cluster(tmp / "pair", folder, 2)
        try:
            for i, n in enumerate(nodes):
                if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > i:
                    os.sched_setaffinity(n.proc.pid, {i})
            bid = b.client.status().cluster.id
            for node, extra in ((b, {}), (a, {})):
                httpx.post(node.url + "/shoal/instances", timeout=900, json={
                    "model": model, "nodes": [{"node": "self"}], **extra}).raise_for_status()
            link = next((p["link"] for p in a.client._call("GET", "/shoal/peers")
                         if p.get("id") == bid), {}) or {}
            asked = [int(x) for x in sizes.split(",")]
            for _ in range(90):  # until both nodes have calibrated (a plan without
                plan = httpx.post(a.url + "/shoal/plan", timeout=120, json={  # guesses)
                    "model": model, "prompt_tokens": asked}).json()
                if not any("assumed" in n for n in plan.get("notes") or []):
                    break
                time.sleep(2)
            aid = a.client.status().cluster.id
            predicted = {r["prompt"]: (r["alone_s"], r["split_s"], r["transfer_s"])
                         for p in plan.get("placements", [])
                         if [x["node"] for x in p["ranks"]] == [aid]
                         for r in p.get("split_prefill") or [] if r["node_id"] == bid}
            for n_tokens in asked:
                alone = ttft(a.url, model, prompt(n_tokens, n_tokens, per_word))
                httpx.post(a.url + "/shoal/instances", timeout=900, json={
                    "model": model, "nodes": [{"node": "self"}], "prefill": bid,
                    "prefill_min": 256}).raise_for_status()
                split = ttft(a.url, model, prompt(n_tokens, n_tokens + 1, per_word))
                rows.append({"tokens": alone[1], "alone": alone[0], "split": split[0],
                             "cached": split[2], "handed": handed(a.log),
                             "predicted": predicted.get(n_tokens)})
                print(rows[-1], flush=True)
                httpx.post(a.url + "/shoal/instances", timeout=900, json={
                    "model": model, "nodes": [{"node": "self"}]}).raise_for_status()
        finally:
            for n in nodes:
                n.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    bw = link.get("bandwidth_MBps")
    print(f"\n{model}, two nodes on one machine, each pinned to its own core; the link "
          f"measured {bw or '?'} MB/s.\n")
    print("| prompt tokens | TTFT alone (s) | TTFT split (s) | predicted alone / split (s) "
          "| KV streamed | prefill there (s) | last frame after it (s) | adopted after that "
          "(s) | predicted transfer (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mb, there, tail, adopt = r["handed"] or (0.0, 0.0, 0.0, 0.0)
        alone_p, split_p, moved_p = r["predicted"] or (0.0, 0.0, 0.0)
        print(f"| {r['tokens']} | {r['alone']:.2f} | {r['split']:.2f} "
              f"({r['cached']} cached) | {alone_p:.2f} / {split_p:.2f} | {mb:.0f} MB | "
              f"{there:.2f} | {tail:.2f} | {adopt:.2f} | {moved_p:.2f} |")

if __name__ == "__main__":
    main()
