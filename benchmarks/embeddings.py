"""Embeddings per second, batched against one at a time, on the bundled all-MiniLM-L6-v2.

Run: .venv/bin/python benchmarks/embeddings.py [--texts 256] [--rounds 2] [--batch N]
The engine (engine/runtime/embedding/, as a worker runs it: its BLAS, without the pipe) embeds the
same texts (8 to 40 words each, a fixed seed) as one request, then as one request per
text; the rounds alternate the two, so drift over the run falls on both. Prints the best
round of each, the ratio, and the peak memory of each way.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORDS = ("the river city night music winter cat engine model light slow quick runs "
         "under over bright machine learning small large garden bread history market "
         "ocean mountain rain question answer paper window").split()


def texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(8, 40))) for _ in range(n)]


def main() -> None:
    from worker_blas import with_worker_blas
    with_worker_blas(__file__)  # the engine as a node's worker runs it, BLAS included
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--texts", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batch", type=int, default=None,
                   help="the most inputs a batch (default: the engine's for this device)")
    a = p.parse_args()

    import mlx.core as mx

    from engine.runtime.embedding import batches
    if a.batch:
        batches.CPU_BATCH = batches.MAX_BATCH = a.batch

    from engine.hub.bundled_embedding import ensure_embedding_model
    from engine.protocol import Embed
    from engine.runtime.embedding import load_engine

    folder = ensure_embedding_model(Path(tempfile.mkdtemp()) / "models")
    engine = load_engine(str(folder), SimpleNamespace(model_id=folder.name), lambda m: None)
    items = texts(a.texts)
    cancel = threading.Event()
    sink: list = []
    engine.embed(Embed("warm", items[:8]), cancel, sink.append)  # first-call compile

    def batched() -> None:
        engine.embed(Embed("b", items), cancel, sink.append)

    def single() -> None:
        for i, text in enumerate(items):
            engine.embed(Embed(f"s{i}", [text]), cancel, sink.append)

    best = {"batched": float("inf"), "one at a time": float("inf")}
    peak = {}
    for _ in range(a.rounds):
        for name, run in (("batched", batched), ("one at a time", single)):
            mx.clear_cache()
            mx.reset_peak_memory()
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
            peak[name] = mx.get_peak_memory()
    tokens = sum(len(engine.tokenizer(t)["input_ids"]) for t in items)
    print(f"all-MiniLM-L6-v2, {a.texts} texts ({tokens} tokens), device "
          f"{mx.default_device()}, at most {batches.batch_limit()} a batch, best of {a.rounds}")
    print("| way | seconds | embeddings/s | peak memory MB |")
    print("|---|---|---|---|")
    for name, seconds in best.items():
        print(f"| {name} | {seconds:.2f} | {a.texts / seconds:.1f} | {peak[name] / 1e6:.1f} |")
    print(f"batched / one at a time: {best['one at a time'] / best['batched']:.2f}x")


if __name__ == "__main__":
    main()
