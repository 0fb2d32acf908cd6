"""Benchmark: what quantized KV costs and what it buys.

Run with a worker's environment (OpenBLAS preloaded), as benchmarks/speculative.py.
- Quality: perplexity of the bundled SmolLM2-135M on a fixed text (the docstrings of six
  standard-library modules of this Python, about 2,100 tokens), fed in 256-token chunks
  through the cache a worker makes (engine/runtime/quant_kv.py): the model's own KV
  (float32 on this CPU, 16-bit on a Mac) against 8- and 4-bit. Quantized keys and values
  are what every later chunk attends to, so the cost grows along the text.
- Speed: decode tokens/s of one request at a ~1,000-token context through the worker's
  batcher, each KV kind, interleaved round by round (ratios: a shared 2-core machine).
  On this CPU MLX's quantized matmuls are plain loops (its Metal kernels are not), so
  quantized attention is slower here than it is on a Mac.
- Room: the longest context that fits one Mac with each KV kind, from the planner's memory
  model (its own weights, activations and overhead rules), for a few models and machines.

Run: .venv/bin/python benchmarks/kv_bits.py [--rounds 2] [--tokens 64]
"""

from __future__ import annotations

import argparse
import difflib
import heapq
import json
import statistics
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TEXT = "\n\n".join(m.__doc__ or "" for m in (json, argparse, difflib, heapq, textwrap,
                                             threading))
KINDS = {"16-bit (the model's own)": None, "8-bit": 8, "4-bit": 4}
ROOM = [("Qwen3-30B-A3B", "4bit", "mac-mini-m4-pro", 24),
        ("Qwen3-32B", "4bit", "macbook-pro-m4-max", 48),
        ("Llama-3.3-70B", "4bit", "mac-studio-m4-max", 128),
        ("Qwen3-235B-A22B", "4bit", "mac-studio-m3-ultra", 256)]


def perplexity(model, tokens: list[int], bits: int | None, chunk: int = 256) -> float:
    import math

    import mlx.core as mx

    from engine.runtime.quant_kv import KV

    cache = KV.for_model(model, bits).make(model)
    nll, n = 0.0, 0
    for at in range(0, len(tokens) - 1, chunk):
        part = tokens[at:at + chunk + 1]
        logits = model(mx.array(part[:-1])[None], cache=cache)[0].astype(mx.float32)
        lps = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        picked = mx.take_along_axis(lps, mx.array(part[1:])[:, None], axis=-1)
        nll -= float(picked.sum().item())
        n += len(part) - 1
    return math.exp(nll / n)


def decode_speed(model, tok, prompt: list[int], tokens: int, rounds: int) -> dict:
    from engine.runtime.batching import Batcher
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.sampling import Sampling

    gens = {k: Batcher(model, tok, PrefixCache(0), 2, kv_bits=b) for k, b in KINDS.items()}
    s = Sampling(max_tokens=tokens, speculative=False)
    got: dict[str, list[float]] = {k: [] for k in KINDS}
    for i in range(rounds + 1):
        for k, gen in gens.items():
            recs = list(gen(model, tok, prompt, s))
            if i:
                got[k].append(recs[-1].generation_tps)
                print(f"round {i} {k:26} {recs[-1].generation_tps:6.1f} tok/s", flush=True)
    return {k: statistics.median(v) for k, v in got.items()}


def room() -> list[tuple[str, str, dict]]:
    from engine import placement_profiles
    from engine.placement.memory import pipeline_rank_memory
    from engine.placement.profiles import node_from, profile_model

    out = []
    for name, quant, machine, gb in ROOM:
        spec = profile_model(placement_profiles.models()["models"][name], name, quant)
        node = node_from({"name": machine, "profile": machine, "memory_gb": gb}, machine,
                         placement_profiles.machines())
        fits = {}
        for label, bits in KINDS.items():
            m = spec.with_kv_bits(bits)
            lo, hi = 0, 1 << 21
            while lo < hi:  # the longest context whose memory fits
                mid = (lo + hi + 1) // 2
                if pipeline_rank_memory(m, node, (0, m.layers), True, True, mid).fits:
                    lo = mid
                else:
                    hi = mid - 1
            fits[label] = lo
        out.append((f"{name} {quant}", f"{machine} {gb} GB", fits))
    return out


def main() -> None:
    from benchmarks.worker_env import as_a_worker_runs
    as_a_worker_runs()
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--tokens", type=int, default=64)
    a = p.parse_args()
    from engine.hub.bundled import ensure_default_model
    from engine.runtime.load import load_model

    folder = ensure_default_model(Path(tempfile.mkdtemp(prefix="shoal-kv-")) / "models")
    model, tok, _ = load_model(folder)
    tokens = tok.encode(TEXT)
    print(f"text: {len(tokens)} tokens", flush=True)
    ppl = {}
    for k, b in KINDS.items():
        t0 = time.perf_counter()
        ppl[k] = perplexity(model, tokens, b)
        print(f"perplexity {k}: {ppl[k]:.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    t0 = time.perf_counter()
    speed = decode_speed(model, tok, tokens[:1000], a.tokens, a.rounds)
    print(f"(decode rounds took {time.perf_counter() - t0:.0f} s)")
    base_p, base_s = ppl["16-bit (the model's own)"], speed["16-bit (the model's own)"]
    print("\n| KV | perplexity | vs 16-bit | decode tok/s at ~1K context | ratio |")
    print("|---|---|---|---|---|")
    for k in KINDS:
        print(f"| {k} | {ppl[k]:.3f} | {ppl[k] / base_p - 1:+.1%} | {speed[k]:.1f} | "
              f"{speed[k] / base_s:.2f} |")
    print("\n| model | machine | context that fits: 16-bit | 8-bit | 4-bit |")
    print("|---|---|---|---|---|")
    for model_name, machine, fits in room():
        cells = " | ".join(f"{v // 1024}K" for v in fits.values())
        print(f"| {model_name} | {machine} | {cells} |")


if __name__ == "__main__":
    main()
