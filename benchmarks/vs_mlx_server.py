"""Benchmark: one Shoal node under load against mlx_lm.server (issue 50, item 1).

Both serve the bundled SmolLM2-135M-Instruct as float32 on the CPU (Shoal unpacks it at
load, engine/runtime/load.py cpu_fast_path; mlx_lm.server gets a float32 copy of the
folder), each with its default settings and the system OpenBLAS preloaded (the worker's
environment, engine/platform/cpu.py; mlx_lm.server on its own would use the wheel's far
slower reference BLAS). Shoal's workers also put their few-rows gemv shim in front of it
(engine/platform/gemv.py); `--mlx-blas shim` gives mlx_lm.server the same, to separate
what the BLAS route gives from what scheduling and drafting give. The load is the
standard serving one: synthetic prompts of about `--prompt` tokens (random words),
`--tokens`-token greedy answers, streamed through the openai SDK by N concurrent clients,
each sending `--per-stream` requests back to back.
The servers alternate in rounds, on the same prompts within a round, so noise on this
shared machine hits both; the ratios are the median of the rounds' own.

Run: .venv/bin/python benchmarks/vs_mlx_server.py [--streams 1 4 8 16] [--rounds 3]
Prints a markdown table (aggregate tokens/s, median time to first token, ratios);
docs/benchmarks.md keeps the figures of the last run.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from nodes import NodeProcess, free_port, home_with  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
# the comparison is the same float32 weights and BLAS: Shoal's MLX engine, not the
# llama.cpp one a Linux CPU node takes for a GGUF import by default (cpu_vs_llamacpp.py)
os.environ.setdefault("SHOAL_CPU_ENGINE", "mlx")


def float32_copy(src: Path, dest: Path) -> Path:
    """The bundled (quantized) folder as plain float32 weights mlx_lm loads as they are."""
    import json

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import dequantize_model, load

    if (dest / "model.safetensors").exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    model, _ = load(str(src))
    model = dequantize_model(model)
    model.apply(lambda v: v.astype(mx.float32))
    mx.save_safetensors(str(dest / "model.safetensors"), dict(tree_flatten(model.parameters())),
                        metadata={"format": "mlx"})
    config = json.loads((src / "config.json").read_text())
    config.pop("quantization", None)
    config.pop("quantization_config", None)
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.name.endswith((".jinja", "_map.json")):
            shutil.copy(f, dest / f.name)
    return dest


class MlxServer:
    """`python -m mlx_lm server` in its own process group, with the worker's environment."""

    def __init__(self, folder: Path, log: Path, shim: bool = False):
        from engine.platform.cpu import worker_env

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlx_lm", "server", "--model", str(folder),
             "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=self._log, stderr=subprocess.STDOUT,
            env=worker_env({**os.environ, "SHOAL_GEMV": "1" if shim else "0"}),
            start_new_session=True)

    def wait_ready(self, timeout: float = 120) -> MlxServer:
        import httpx
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlx_lm.server exited ({self.proc.returncode})")
            try:
                httpx.get(self.url + "/v1/models", timeout=2).raise_for_status()
                return self
            except httpx.HTTPError:
                time.sleep(0.2)
        raise TimeoutError(f"mlx_lm.server not up after {timeout} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()


def prompts(tokenizer: object, n: int, length: int, seed: int) -> list[str]:
    """`n` distinct prompts of about `length` tokens: random vocabulary words (no prefix
    shared between them, so neither server's prefix cache helps)."""
    words = [w for w in (tokenizer.decode([i]).strip()  # type: ignore[attr-defined]
                         for i in range(1000, 20000)) if w.isalpha() and len(w) > 2]
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        text = "Continue this text: " + " ".join(rng.choice(words) for _ in range(length))
        ids = tokenizer.encode(text)  # type: ignore[attr-defined]
        out.append(tokenizer.decode(ids[:length]))  # type: ignore[attr-defined]
    return out


def one(url: str, model: str, prompt: str, tokens: int) -> dict[str, float]:
    """One streamed chat: when it began and ended, its time to first token, its tokens."""
    import openai

    oai = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)
    t0 = time.perf_counter()
    first, n = 0.0, 0
    for chunk in oai.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=tokens,
            temperature=0, stream=True, stream_options={"include_usage": True}):
        if chunk.choices and chunk.choices[0].delta.content and not first:
            first = time.perf_counter()
        if chunk.usage:
            n = chunk.usage.completion_tokens
    return {"start": t0, "end": time.perf_counter(), "ttft": first - t0, "n": n}


def load(url: str, model: str, texts: list[str], streams: int, tokens: int
         ) -> tuple[float, float]:
    """`streams` clients, each sending its share of `texts` one after another: (aggregate
    answer tokens/s over the whole run, median time to first token)."""
    done: list[dict[str, float]] = []
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            for text in texts[i::streams]:
                done.append(one(url, model, text, tokens))
        except BaseException as e:
            errors.append(e)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    span = max(r["end"] for r in done) - min(r["start"] for r in done)
    return sum(r["n"] for r in done) / span, statistics.median(r["ttft"] for r in done)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--streams", type=int, nargs="+", default=[1, 4, 8, 16])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--per-stream", type=int, default=2)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--node-args", default="", help="extra `shoal node` flags")
    p.add_argument("--mlx-blas", choices=("openblas", "shim"), default="openblas",
                   help="mlx_lm.server's BLAS: the system OpenBLAS, or with Shoal's shim too")
    args = p.parse_args()
    from engine.hub.bundled import ensure_default_model

    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-vs-mlx-"))
    servers: list = []
    try:
        model = ensure_default_model(tmp / "models")
        fp32 = float32_copy(model, tmp / "fp32" / MODEL)
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(str(fp32))
        node = NodeProcess(home_with(tmp / "shoal", model), MODEL, *args.node_args.split())
        servers.append(node)
        node.wait_healthy().wait_ready(300)
        mlx = MlxServer(fp32, tmp / "mlx.log", shim=args.mlx_blas == "shim")
        servers.append(mlx)
        mlx.wait_ready()
        targets = {"shoal": (node.url, MODEL), "mlx_lm.server": (mlx.url, str(fp32))}
        for url, name in targets.values():  # warm both (first-call compiles, caches)
            load(url, name, prompts(tok, 4, args.prompt, 0), 4, 8)
        got: dict[tuple[str, int], list[tuple[float, float]]] = {}
        seed = 1
        for r in range(args.rounds):
            for n in args.streams:
                order = list(targets) if (r + n) % 2 == 0 else list(targets)[::-1]
                # fresh prompts every round, no prefix cache hits; the same for both
                # servers in a round, so its ratio compares the same answers
                seed += 1
                texts = prompts(tok, n * args.per_stream, args.prompt, seed)
                for who in order:
                    got.setdefault((who, n), []).append(load(*targets[who], texts, n,
                                                             args.tokens))
                    print(f"round {r + 1} {who} {n} streams: "
                          f"{got[(who, n)][-1][0]:.1f} tok/s, "
                          f"TTFT {got[(who, n)][-1][1] * 1000:.0f} ms", file=sys.stderr)
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nSmolLM2-135M-Instruct as float32 on the CPU ({os.cpu_count()} cores, shared "
          f"machine), ~{args.prompt}-token synthetic prompts, {args.tokens}-token greedy "
          f"answers, {args.per_stream} requests per stream, median of {args.rounds} "
          "alternating rounds (ratios: the median of each round's own); mlx_lm.server's "
          f"BLAS: {args.mlx_blas}.\n")
    print("| streams | Shoal tok/s | mlx_lm.server tok/s | ratio | Shoal TTFT ms | "
          "mlx_lm.server TTFT ms | TTFT ratio |")
    print("|---|---|---|---|---|---|---|")
    for n in args.streams:
        s, m = got[("shoal", n)], got[("mlx_lm.server", n)]
        st, mt = statistics.median(x[0] for x in s), statistics.median(x[0] for x in m)
        sf, mf = statistics.median(x[1] for x in s), statistics.median(x[1] for x in m)
        # the ratio columns: the median of each round's own ratio (the two back to back,
        # on the same prompts), which a slow hour shared by both doesn't move
        ratio = statistics.median(a[0] / b[0] for a, b in zip(s, m))
        ttft = statistics.median(a[1] / b[1] for a, b in zip(s, m))
        print(f"| {n} | {st:.1f} | {mt:.1f} | {ratio:.2f} | {sf * 1000:.0f} | "
              f"{mf * 1000:.0f} | {ttft:.2f} |")
    print("\nEach round's ratios (tokens/s, time to first token), the two servers run "
          "back to back:")
    for n in args.streams:
        pairs = zip(got[("shoal", n)], got[("mlx_lm.server", n)])
        print(f"- {n} streams: " + ", ".join(f"{s[0] / m[0]:.2f} / {s[1] / m[1]:.2f}"
                                             for s, m in pairs))


if __name__ == "__main__":
    main()
