"""Benchmark: Shoal's streaming API against in-process mlx_lm.stream_generate, and the CPU
settings that matter on Linux (OpenBLAS preload, float32 vs float16 quantization scales).

Same model (the bundled SmolLM2-135M-Instruct, imported by Shoal), same prompt, same run.
Run: .venv/bin/python benchmarks/single_node.py [--tokens 128] [--rounds 3]
Prints a markdown table; docs/benchmarks.md keeps the figures of the last run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]

IN_PROCESS = r"""
import json, sys, time
sys.path.insert(0, sys.argv[4])
import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import stream_generate
from engine.runtime.load import cpu_fast_path
folder, n = sys.argv[1], int(sys.argv[2])
model, tok = load(folder)
model = cpu_fast_path(model)  # the same weights the worker runs on
prompt = tok.apply_chat_template(json.loads(sys.argv[3]), add_generation_prompt=True)
for _ in sys.stdin:  # one round per line, so rounds can interleave with the API's
    t0 = time.perf_counter(); ttft = None
    for r in stream_generate(model, tok, mx.array(prompt), max_tokens=n):
        if ttft is None and r.text:  # measured as a client sees it: first visible text
            ttft = time.perf_counter() - t0; t_first = time.perf_counter()
    dt = time.perf_counter() - t_first
    print(json.dumps({"ttft": ttft, "decode_tps": (r.generation_tokens - 1) / dt,
                      "prompt_tps": r.prompt_tps, "tokens": r.generation_tokens}), flush=True)
"""


class InProcess:
    """mlx-lm in a process of its own, same environment as a worker, run round by round."""

    def __init__(self, folder: Path, n: int, env: dict[str, str]):
        self.p = subprocess.Popen([sys.executable, "-c", IN_PROCESS, str(folder), str(n),
                                   json.dumps(PROMPT), str(ROOT)], env=env, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def round(self) -> dict:
        assert self.p.stdin and self.p.stdout
        self.p.stdin.write("go\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self) -> None:
        if self.p.stdin:
            self.p.stdin.close()
        self.p.wait(60)


def in_process(folder: Path, n: int, rounds: int, env: dict[str, str]) -> list[dict]:
    ip = InProcess(folder, n, env)
    try:
        ip.round()  # warm-up
        return [ip.round() for _ in range(rounds)]
    finally:
        ip.close()


def api_round(url: str, model: str, n: int) -> dict:
    import httpx
    body = {"model": model, "messages": PROMPT, "max_tokens": n, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    if True:
        t0 = time.perf_counter()
        ttft = t_first = None
        usage = None
        with httpx.stream("POST", url + "/v1/chat/completions", json=body,
                          timeout=600) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                c = json.loads(line[6:])
                if c.get("usage"):
                    usage = c["usage"]
                if c.get("choices") and c["choices"][0]["delta"].get("content") is not None \
                        and ttft is None and c["choices"][0]["delta"].get("role") is None:
                    ttft = time.perf_counter() - t0
                    t_first = time.perf_counter()
        t_end = time.perf_counter()
        toks = usage["completion_tokens"]
        # Same definition as mlx-lm: tokens after the first over the time after the first.
        return {"ttft": ttft, "decode_tps": (toks - 1) / (t_end - t_first), "tokens": toks}


def start_node(home: Path, model: str) -> tuple[subprocess.Popen, str]:
    from nodes import NodeProcess
    node = NodeProcess(home, model)
    node.wait_healthy()
    node.wait_ready(600)
    return node, node.url


def half_scales_copy(src: Path, dst: Path) -> Path:
    """The same model with float16 quantization scales and biases (what the GGUF holds)."""
    import mlx.core as mx
    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors"):
        w = mx.load(str(f))
        w = {k: (v.astype(mx.float16) if k.endswith((".scales", ".biases")) else v)
             for k, v in w.items()}
        mx.save_safetensors(str(f), w)
    return dst


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    from engine.hub.bundled import DEFAULT_MODEL_ID, ensure_default_model
    from engine.platform.cpu import worker_env

    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-"))
    try:
        home = tmp / "home"
        folder = ensure_default_model(home / "models")
        env = worker_env()
        print(f"model {DEFAULT_MODEL_ID}, {a.tokens} tokens, median of {a.rounds} rounds "
              f"after a warm-up, {os.cpu_count()} cores, OpenBLAS preload: "
              f"{env.get('LD_PRELOAD', 'none')}\n")
        node, url = start_node(home, DEFAULT_MODEL_ID)
        ip = InProcess(folder, a.tokens, env)
        api, local = [], []
        try:
            api_round(url, DEFAULT_MODEL_ID, a.tokens), ip.round()  # warm-up
            for _ in range(a.rounds):  # interleaved, so drift in the machine hits both
                api.append(api_round(url, DEFAULT_MODEL_ID, a.tokens))
                local.append(ip.round())
        finally:
            ip.close()
            node.stop()
        print("| path | decode tokens/s | time to first token |\n|---|---|---|")
        print(f"| in-process mlx_lm.stream_generate | {med(local, 'decode_tps'):.1f} | "
              f"{med(local, 'ttft') * 1000:.1f} ms |")
        print(f"| Shoal streaming API | {med(api, 'decode_tps'):.1f} | "
              f"{med(api, 'ttft') * 1000:.1f} ms |")
        print(f"\nAPI / in-process decode: {med(api, 'decode_tps') / med(local, 'decode_tps'):.3f}"
              f"; API - in-process TTFT: {(med(api, 'ttft') - med(local, 'ttft')) * 1000:.1f} ms\n")

        plain = worker_env({**os.environ, "SHOAL_OPENBLAS": "0"})
        quant = {**env, "SHOAL_CPU_DEQUANTIZE": "0"}
        rows_ = [("OpenBLAS preloaded, weights unpacked to float32 (Shoal's default)", local),
                 ("bundled reference BLAS, weights unpacked to float32",
                  in_process(folder, a.tokens, 2, plain)),
                 ("OpenBLAS preloaded, 4-bit kept, float32 scales",
                  in_process(folder, a.tokens, 2, quant)),
                 ("OpenBLAS preloaded, 4-bit kept, float16 scales (as in the GGUF)",
                  in_process(half_scales_copy(folder, tmp / "half"), a.tokens, 2, quant))]
        print("| CPU setting (in-process) | prefill tokens/s | decode tokens/s |\n|---|---|---|")
        for name, rows in rows_:
            print(f"| {name} | {med(rows, 'prompt_tps'):.0f} | {med(rows, 'decode_tps'):.1f} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
