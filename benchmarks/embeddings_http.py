"""Benchmark: embeddings per second over HTTP from a node, the bundled all-MiniLM-L6-v2
served beside the forcing chat model (engine/node/beside.py): the same texts as one
request to /v1/embeddings, as one request per text in turn, and as one request per text
from 8 clients at once (queued to the one worker); then one rerank of 64 documents.

Run: .venv/bin/python benchmarks/embeddings_http.py [--texts 256]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tests"))
sys.path.append(str(ROOT / "tests" / "engine" / "api"))

WORDS = ("the river city night music winter cat engine model light slow quick runs under "
         "over bright machine garden bread history market ocean mountain rain").split()


def texts(n: int) -> list[str]:
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40))) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", type=int, default=256)
    a = ap.parse_args()
    from embed_node import MINILM, embed_node

    gen = embed_node(Path(tempfile.mkdtemp(prefix="embed-bench-")))
    node = next(gen)
    try:
        c = httpx.Client(base_url=node.url, timeout=600)

        def embed(inp: list[str] | str) -> None:
            r = c.post("/v1/embeddings", json={"model": MINILM, "input": inp})
            r.raise_for_status()

        embed("warm up")  # starts the beside worker
        xs = texts(a.texts)
        t = time.perf_counter()
        embed(xs)
        batched = time.perf_counter() - t
        t = time.perf_counter()
        for x in xs:
            embed(x)
        single = time.perf_counter() - t
        t = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda x: httpx.post(node.url + "/v1/embeddings", timeout=600, json={
                "model": MINILM, "input": x}).raise_for_status(), xs))
        concurrent_s = time.perf_counter() - t
        t = time.perf_counter()
        c.post("/v1/rerank", json={"model": MINILM, "query": "a river at night",
                                   "documents": xs[:64]}).raise_for_status()
        rerank = time.perf_counter() - t
        n = len(xs)
        print(f"{n} texts: one request {n / batched:.0f}/s ({batched:.2f} s); one at a time "
              f"{n / single:.0f}/s ({single:.2f} s); 8 clients at once "
              f"{n / concurrent_s:.0f}/s ({concurrent_s:.2f} s); batched is "
              f"{single / batched:.1f}x one at a time")
        print(f"rerank of 64 documents: {rerank:.2f} s")
    finally:
        next(gen, None)


if __name__ == "__main__":
    main()
