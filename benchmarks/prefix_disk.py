"""Benchmark: time to first token of a chat's next turn after the node restarts, with and
without the prefix cache's disk tier (--prefix-disk-gb).

Setup: the bundled SmolLM2-135M on a real node (this machine, 2 cores). A conversation of
about 3,000 tokens is sent; the node is stopped and started again (the worker's memory,
and so its prefix cache, is gone); then the conversation's next turn (the answer and one
more question appended) is streamed and the time to its first token taken. Both modes in
each round, one after the other; medians of --rounds rounds.

Run: .venv/bin/python benchmarks/prefix_disk.py [--rounds 3]
"""

from __future__ import annotations

import argparse
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

PARAGRAPH = ("The lighthouse keeper wrote down every ship that passed, the hour, the wind "
             "and the colour of the sea, and kept the books on a shelf by the stairs. ")


def conversation() -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": "You are a careful archivist."}]
    for i in range(8):
        msgs += [{"role": "user", "content": f"Entry {i}: " + PARAGRAPH * 8},
                 {"role": "assistant", "content": f"Noted entry {i}. " + PARAGRAPH * 2}]
    return msgs + [{"role": "user", "content": "What did the keeper write down?"}]


def first_token_s(url: str, model: str, msgs: list[dict[str, str]]) -> tuple[float, str, int]:
    """(seconds to the first content token, the whole answer, cached prompt tokens)."""
    t0, first, text, cached = time.perf_counter(), 0.0, "", 0
    body = {"model": model, "messages": msgs, "max_tokens": 16, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    import json
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for c in chunk.get("choices") or []:
                if c["delta"].get("content"):
                    first = first or time.perf_counter() - t0
                    text += c["delta"]["content"]
            if chunk.get("usage"):
                cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
    return first, text, cached


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    from engine.hub.bundled import DEFAULT_MODEL_ID, ensure_default_model
    from nodes import NodeProcess

    tmp = Path(tempfile.mkdtemp(prefix="shoal-disk-"))
    try:
        models = tmp / "models"
        ensure_default_model(models)
        msgs = conversation()
        got: dict[bool, list[float]] = {False: [], True: []}
        for i in range(a.rounds):
            for disk in (False, True):
                home = tmp / f"home-{disk}-{i}"
                home.mkdir()
                (home / "models").symlink_to(models)
                extra = ("--prefix-disk-gb", "2") if disk else ()
                node = NodeProcess(home, DEFAULT_MODEL_ID, *extra).wait_healthy()
                node.wait_ready(300)
                _, answer, _ = first_token_s(node.url, DEFAULT_MODEL_ID, msgs)
                node.stop()
                node = NodeProcess(home, DEFAULT_MODEL_ID, *extra).wait_healthy()
                node.wait_ready(300)
                turn = [*msgs, {"role": "assistant", "content": answer},
                        {"role": "user", "content": "And the wind?"}]
                s, _, cached = first_token_s(node.url, DEFAULT_MODEL_ID, turn)
                node.stop()
                got[disk].append(s)
                print(f"round {i + 1} disk={disk!s:5} first token after restart {s:5.2f} s "
                      f"({cached} prompt tokens cached)", flush=True)
        plain, kept = statistics.median(got[False]), statistics.median(got[True])
        print("\n| after a restart | time to first token (median) | ratio |")
        print("|---|---|---|")
        print(f"| no disk tier | {plain:.2f} s | 1.00 |")
        print(f"| prefix cache on disk | {kept:.2f} s | {plain / kept:.1f}x faster |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
