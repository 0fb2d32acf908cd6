"""Benchmark: a client that gives up mid-prefill and retries at once (an SDK's timeout,
Stop and send again). Issue 48, point 5: before, the retry waited the whole prefill again
(a ~2,600-word prompt: 21 s cold, 21.7 s for the retry after giving up at 12 s); now the
chunks the first attempt finished stay in the prefix cache and the retry does the rest.

Setup: the bundled SmolLM2-135M on a real node (this machine). Each round: a cold request
(a prompt of --words words, nothing cached: each round's prompts differ from their first
words) streamed for its time to first token; then another prompt of the same length sent
with an httpx timeout of --give-up times that cold time (the client leaves), and at once
the same prompt again, streamed: its time to first token and the prompt tokens its usage
says were cached. Medians of --rounds rounds.

Run: .venv/bin/python benchmarks/prefill_resume.py [--words 2600] [--give-up 0.5]
     [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

TEXT = ("The lighthouse keeper wrote down every ship that passed, the hour, the wind and "
        "the colour of the sea, and kept the books on a shelf by the stairs. ").split()


def prompt(tag: str, words: int) -> list[dict[str, str]]:
    body = " ".join(TEXT[i % len(TEXT)] for i in range(words))
    return [{"role": "user", "content": f"{tag}: {body}\nSum it up."}]


def first_token(url: str, model: str, msgs: list[dict[str, str]]
                ) -> tuple[float, str, int, int]:
    """(seconds to the first content token, the answer, cached and prompt tokens)."""
    t0, first, text, usage = time.perf_counter(), 0.0, "", {}
    body = {"model": model, "messages": msgs, "max_tokens": 8, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=900) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            for c in chunk.get("choices") or []:
                if c["delta"].get("content"):
                    first = first or time.perf_counter() - t0
                    text += c["delta"]["content"]
            usage = chunk.get("usage") or usage
    return first, text, usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]


def give_up(url: str, model: str, msgs: list[dict[str, str]], after: float) -> None:
    """A client whose timeout is shorter than the prefill (non-streaming, as SDKs send)."""
    try:
        httpx.post(url + "/v1/chat/completions", timeout=after, json={
            "model": model, "messages": msgs, "max_tokens": 8, "temperature": 0})
    except httpx.TimeoutException:
        return
    raise SystemExit("the request finished before the client gave up: use more --words")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--words", type=int, default=2600)
    p.add_argument("--give-up", type=float, default=0.5,
                   help="when the client leaves, as a share of the cold time to first token")
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    from engine.hub.bundled import DEFAULT_MODEL_ID, ensure_default_model
    from nodes import NodeProcess

    tmp = Path(tempfile.mkdtemp(prefix="shoal-resume-"))
    node = None
    try:
        home = tmp / "home"
        home.mkdir()
        ensure_default_model(home / "models")
        node = NodeProcess(home, DEFAULT_MODEL_ID).wait_healthy()
        node.wait_ready(300)
        first_token(node.url, DEFAULT_MODEL_ID, prompt("warm-up", 50))
        colds, retries, shares = [], [], []
        for i in range(a.rounds):
            cold, _, _, n = first_token(node.url, DEFAULT_MODEL_ID, prompt(f"cold {i}", a.words))
            msgs = prompt(f"retried {i}", a.words)
            t0 = time.perf_counter()
            give_up(node.url, DEFAULT_MODEL_ID, msgs, a.give_up * cold)
            left = time.perf_counter() - t0
            retry, _, cached, _ = first_token(node.url, DEFAULT_MODEL_ID, msgs)
            colds.append(cold)
            retries.append(retry)
            shares.append(cached / n)
            print(f"round {i + 1}: {n} prompt tokens; cold {cold:5.2f} s; the client left at "
                  f"{left:5.2f} s; its retry {retry:5.2f} s with {cached} tokens cached "
                  f"({cached / n:.0%})", flush=True)
        cold, retry = statistics.median(colds), statistics.median(retries)
        print(f"\n| {a.words} words, the client gives up at {a.give_up:.0%} of the cold wait "
              "| time to first token (median) | ratio |")
        print("|---|---|---|")
        print(f"| cold (and, before, every retry) | {cold:.2f} s | 1.00 |")
        print(f"| retry after giving up ({statistics.median(shares):.0%} of the prompt "
              f"cached) | {retry:.2f} s | {retry / cold:.2f} |")
        print(f"| the client's whole wait, giving up then retrying | "
              f"{a.give_up * cold + retry:.2f} s | {(a.give_up * cold + retry) / cold:.2f} |")
    finally:
        if node is not None:
            node.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
