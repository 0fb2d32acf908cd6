"""Benchmark: many turns and many users, through the API as clients see it.

Real node processes serving the bundled SmolLM2-135M-Instruct (greedy, openai SDK,
streaming), ratios measured in one run:
- prefix cache: time to first token of a chat's second turn (a ~1,500-token conversation
  plus one short user turn) over its first, on one node and on a 2-node pipeline;
- continuous batching: aggregate decode tokens/s of 4 concurrent streams over one alone,
  on one node and on a 2-node pipeline;
- chunked prefill: time to first token of a short request while a ~3,000-token prompt
  prefills, over the same request on an idle node, on one node and on the pipeline.

Run: .venv/bin/python benchmarks/serving.py [--tokens 64]
Prints a markdown table; docs/benchmarks.md ("Serving") keeps the figures of the last run.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from nodes import NodeProcess, home_with, start_cluster  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
FILLER = ("The lighthouse keeper wrote in his log every evening: the weather, the ships "
          "that passed, the oil he burned and the birds that came to rest on the rail. ")


def stream(url: str, messages: list[dict], tokens: int) -> dict[str, float]:
    """One streamed chat: time to first token, decode tokens/s, tokens, cached."""
    import openai

    oai = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)
    t0 = time.perf_counter()
    first = last = None
    n, cached = 0, 0
    for chunk in oai.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}):
        if chunk.usage:
            cached = chunk.usage.prompt_tokens_details.cached_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            now = time.perf_counter()
            first = first or now
            last = now
            n += 1
    assert first is not None and last is not None
    return {"ttft": first - t0, "tps": (n - 1) / (last - first) if n > 1 else 0.0,
            "n": n, "span": last - first, "start": first, "end": last, "cached": cached}


def conversation(words: int) -> tuple[list[dict], list[dict]]:
    system = {"role": "system", "content": (FILLER * (words // 30 + 1))}
    first = [system, {"role": "user", "content": "Summarise the log in one line."}]
    second = first + [{"role": "assistant", "content": "He kept the light and the log."},
                      {"role": "user", "content": "And the birds?"}]
    return first, second


def turns(url: str, tokens: int) -> tuple[float, int]:
    first, second = conversation(1100)
    a = stream(url, first, tokens)
    b = stream(url, second, tokens)
    return b["ttft"] / a["ttft"], int(b["cached"])


def concurrency(url: str, tokens: int, n: int = 4) -> float:
    ask = [[{"role": "user", "content": f"Tell story number {i} about the sea."}]
           for i in range(n)]
    alone = stream(url, ask[0], tokens)["tps"]
    out: list[dict] = [{}] * n

    def one(i: int) -> None:
        out[i] = stream(url, ask[i], tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    start, end = min(r["start"] for r in out), max(r["end"] for r in out)
    together = sum(r["n"] - 1 for r in out) / (end - start)
    return together / alone


def prefill_stall(url: str, runs: int = 3) -> float:
    """The median over `runs` tries (one try depends on where in a chunk the short request
    lands, and on this shared machine's load at that second)."""
    import statistics

    short = [{"role": "user", "content": "Say hi."}]
    long = [{"role": "user", "content": FILLER * 110 + " Summarise."}]
    ratios = []
    for _ in range(runs):
        idle = min(stream(url, short, 2)["ttft"] for _ in range(2))
        t = threading.Thread(target=stream, args=(url, long, 2))
        t.start()
        time.sleep(2.0)  # the long prompt is prefilling
        busy = stream(url, short, 2)["ttft"]
        t.join()
        ratios.append(busy / idle)
    return statistics.median(ratios)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=64)
    args = p.parse_args()
    from engine.hub.bundled import ensure_default_model

    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-serving-"))
    rows = []
    try:
        model = ensure_default_model(tmp / "models")
        node = NodeProcess(home_with(tmp / "one", model), MODEL).wait_healthy()
        try:
            node.wait_ready(300)
            stream(node.url, [{"role": "user", "content": "warm up"}], 4)
            r, cached = turns(node.url, args.tokens)
            rows.append(("one node", "turn-2 / turn-1 time to first token", r,
                         f"≤ 0.15 ({cached} tokens cached)"))
            rows.append(("one node", "4 streams / 1 stream decode tokens/s",
                         concurrency(node.url, args.tokens), "≥ 2.5"))
            rows.append(("one node", "short TTFT while a 3,000-token prompt prefills / idle",
                         prefill_stall(node.url), "≤ 3"))
        finally:
            node.stop()
        a, b = start_cluster(tmp / "pair", model, 2)
        try:
            import httpx
            bid = b.client.status().cluster.id
            r = httpx.post(a.url + "/shoal/instances", timeout=600, json={
                "model": MODEL, "strategy": "pipeline",
                "nodes": [{"node": "self", "layers": [0, 15]}, {"node": bid,
                                                                "layers": [15, 30]}]})
            r.raise_for_status()
            stream(a.url, [{"role": "user", "content": "warm up"}], 4)
            t, cached = turns(a.url, args.tokens)
            rows.append(("2-node pipeline", "turn-2 / turn-1 time to first token", t,
                         f"≤ 0.15 ({cached} tokens cached)"))
            rows.append(("2-node pipeline", "4 streams / 1 stream decode tokens/s",
                         concurrency(a.url, args.tokens), "≥ 1.5"))
            rows.append(("2-node pipeline",
                         "short TTFT while a 3,000-token prompt prefills / idle",
                         prefill_stall(a.url), "≤ 3"))
        finally:
            a.stop()
            b.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nSmolLM2-135M-Instruct (bundled), greedy, {args.tokens} new tokens, streamed "
          "through the openai SDK; every node on this machine.\n")
    print("| where | ratio | measured | goal |")
    print("|---|---|---|---|")
    for where, what, value, goal in rows:
        print(f"| {where} | {what} | {value:.2f} | {goal} |")


if __name__ == "__main__":
    main()
