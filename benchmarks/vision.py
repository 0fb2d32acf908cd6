"""Benchmark: time to first token for a request with one image against the same text
alone (issue 49), in one worker process: Shoal's vision path (mlx-lm's language model,
mlx-vlm's vision tower, the prompt as input embeddings) on tiny random-weight Gemma 3
checkpoints built from the published config (tests/tiny_vision.py): the test model (4
image tokens) and a bigger shrink (hidden 512, a 224 px SigLIP of 6 layers, 64 image
tokens). Each figure is the median of --rounds cold requests (no prefix cache), after
one warm-up; the image is decoded and processed inside the timed span, as a request's is.
Also the same image request again with the prefix cache on (a chat's next turn re-sends
its images): the vision tower doesn't run when every image token is cached.

The process runs itself again with the worker's BLAS (the system OpenBLAS preloaded).

Run: .venv/bin/python benchmarks/vision.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

TEXT = "Describe what you see in as much detail as you can, please."


def first_token_s(model: Any, tokenizer: Any, vision: Any, req: Any,
                  prefix: Any = None) -> float:
    from engine.runtime.generate import generate
    from engine.runtime.request import prepare
    from engine.runtime.sampling import Sampling

    tic = time.perf_counter()
    ids, _, _, _, images = prepare(tokenizer, req, 1 << 20, vision)
    sampling = Sampling.of(req.sampling, 1, None)
    for _ in generate(model, tokenizer, ids, sampling, prefix=prefix, images=images):
        took = time.perf_counter() - tic
    return took


def measure(folder: Path, rounds: int) -> dict[str, Any]:
    from engine.protocol import GenerateRequest, SamplingRequest
    from engine.runtime.load import load_model
    from engine.runtime.vision.tower import Vision
    from tiny_vision import image_input, png

    model, tokenizer, _ = load_model(folder)
    vision = Vision(folder, model)
    s = SamplingRequest(max_tokens=1, temperature=0.0)
    text = GenerateRequest(messages=[{"role": "user", "content": TEXT}], sampling=s)
    image = GenerateRequest(
        messages=[{"role": "user", "content": TEXT,
                   "parts": [{"type": "image", "image": 0}, {"type": "text", "text": TEXT}]}],
        images=[image_input(png(640, 480, 7))], sampling=s)
    out: dict[str, Any] = {}
    for name, req in (("text", text), ("image", image)):
        first_token_s(model, tokenizer, vision, req)  # warm-up
        out[name] = statistics.median(first_token_s(model, tokenizer, vision, req)
                                      for _ in range(rounds))
    from engine.runtime.prefix import PrefixCache
    prefix = PrefixCache(100_000)
    first_token_s(model, tokenizer, vision, image, prefix)  # the image's first turn
    out["again"] = statistics.median(first_token_s(model, tokenizer, vision, image, prefix)
                                     for _ in range(rounds))
    from engine.runtime.request import prepare
    out["text_tokens"] = len(prepare(tokenizer, text, None, vision)[0])
    out["image_tokens"] = len(prepare(tokenizer, image, None, vision)[0])
    return out


def main() -> None:
    from worker_blas import with_worker_blas

    from tiny_vision import SMALL, TINY, make_tiny_gemma3
    with_worker_blas(__file__)

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, sizes in (("tiny", TINY), ("small", SMALL)):
            folder = make_tiny_gemma3(Path(tmp) / name, sizes=sizes)
            r = measure(folder, a.rounds)
            print(f"gemma3 {name}: text alone {r['text'] * 1000:.1f} ms "
                  f"({r['text_tokens']} tokens), with one 640x480 image "
                  f"{r['image'] * 1000:.1f} ms ({r['image_tokens']} tokens), "
                  f"{r['image'] / r['text']:.2f}x; the same image again (prefix cache hit) "
                  f"{r['again'] * 1000:.1f} ms")


if __name__ == "__main__":
    main()
