"""Benchmark: one model served by a 2-rank pipeline (two worker processes, MLX ring over
loopback) against the one-process worker, same model, same environment, same run.

Run: .venv/bin/python benchmarks/distributed.py [--tokens 128] [--rounds 5] [--model smollm2]
Prints a markdown table; docs/benchmarks.md ("Distributed") keeps the figures of the last run.
Both paths stay loaded side by side (an idle group uses no CPU) and rounds interleave.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "engine" / "runtime"))

from dist_harness import Group, Worker, generate  # noqa: E402

PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]
STATS = re.compile(r"rank (\d+) request stats: steps=(\d+) total_ms=([\d.]+) "
                   r"compute_ms_per_step=([\d.]+) comm_ms_per_step=([\d.]+) "
                   r"wait_ms_per_step=([\d.]+)")


def timed_round(w: Worker, rid: str, n: int) -> dict:
    """Decode tokens/s as a client sees it: tokens after the first over the time after it."""
    t0 = time.perf_counter()
    w.send({"op": "generate", "id": rid, "request": {
        "messages": PROMPT, "sampling": {"max_tokens": n, "temperature": 0}}})
    stamps = []
    while True:
        ev = w.expect(lambda e: e.get("id") == rid, 600)
        if ev["ev"] in ("delta", "done"):
            stamps.append(time.perf_counter())
        if ev["ev"] in ("done", "error"):
            break
    assert ev["ev"] == "done", ev
    toks = ev["generation_tokens"]
    return {"ttft": stamps[0] - t0, "decode_tps": (toks - 1) / (stamps[-1] - stamps[0]),
            "tokens": toks}


def make_model(kind: str, tmp: Path) -> Path:
    if kind == "smollm2":
        from engine.hub.bundled import ensure_default_model
        return ensure_default_model(tmp / "models")
    from tiny import LLAMA, QWEN3, make_tiny_model
    if kind == "wide-moe":  # Qwen3-MoE shape: 16 experts, 2 routed per token
        return make_tiny_model(tmp / "wide-moe", {**QWEN3, "model_type": "qwen3_moe"},
                               hidden_size=1024, num_attention_heads=16,
                               num_key_value_heads=4, head_dim=64, num_hidden_layers=8,
                               num_experts=16, num_experts_per_tok=2, decoder_sparse_step=1,
                               mlp_only_layers=[], moe_intermediate_size=1024,
                               norm_topk_prob=True)
    if kind == "tiny-llama":  # the tests' model: a token costs well under a millisecond
        return make_tiny_model(tmp / "tiny-llama", LLAMA, num_hidden_layers=6)
    # the tests' architecture made big enough for a token to cost tens of milliseconds
    return make_tiny_model(tmp / "wide-llama", LLAMA, hidden_size=1024, intermediate_size=4096,
                           num_attention_heads=16, num_key_value_heads=4,
                           num_hidden_layers=8)


def peak_rss(w: Worker) -> int:
    """VmHWM: the process's peak resident memory so far."""
    for line in Path(f"/proc/{w.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def rank_stats(log: Path) -> list[tuple[float, ...]]:
    return [tuple(float(x) for x in m.groups()[2:])
            for m in STATS.finditer(log.read_text(errors="replace"))]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--model", choices=("smollm2", "wide-llama", "wide-moe", "tiny-llama"),
                   default="smollm2")
    p.add_argument("--split", type=int, default=0, help="first layer of rank 1 (0: half)")
    p.add_argument("--strategy", choices=("pipeline", "tensor"), default="pipeline")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for every worker (single and ranks)")
    p.add_argument("--rank-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for the ranks only")
    args = p.parse_args()
    from engine.platform.cpu import worker_env
    env = {**worker_env(), **dict(kv.split("=", 1) for kv in args.env)}
    rank_env = {**env, **dict(kv.split("=", 1) for kv in args.rank_env)}

    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-dist-"))
    folder = make_model(args.model, tmp)
    import json
    n_layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    split = args.split or n_layers // 2
    weights = sum(f.stat().st_size for f in folder.glob("*.safetensors"))

    single = Worker(["--model", str(folder), "--model-id", "m"], tmp / "single.log", env)
    single.expect(lambda e: e["ev"] == "ready", 600)
    group = Group(tmp / "group", folder, 2, args.strategy,
                  [[0, split], [split, n_layers]] if args.strategy == "pipeline" else None,
                  env=rank_env)
    try:
        ready = group.ready(600)
        for w in (single, group.leader):  # warm-up
            generate(w, "warm", PROMPT, max_tokens=16)
        rs: dict[str, list[dict]] = {"single": [], args.strategy: []}
        for i in range(args.rounds):
            rs["single"].append(timed_round(single, f"s{i}", args.tokens))
            rs[args.strategy].append(timed_round(group.leader, f"p{i}", args.tokens))
        rss = [peak_rss(w) for w in (*group.ranks, single)]
        group.shutdown()
        stats = [rank_stats(w.log)[-args.rounds:] for w in group.ranks]  # before cleanup
    finally:
        group.kill()
        single.kill()
        shutil.rmtree(tmp, ignore_errors=True)

    med = {k: {m: statistics.median(r[m] for r in v) for m in ("decode_tps", "ttft")}
           for k, v in rs.items()}
    print(f"\nModel: {args.model} ({n_layers} layers, {weights / 1e6:.0f} MB of weights on "
          f"disk), greedy, {args.tokens} new tokens, median of {args.rounds} interleaved "
          f"rounds; {args.strategy}" + (f", ranks split at layer {split}" if args.strategy ==
                                        "pipeline" else "") + ".\n")
    print("| path | decode tokens/s | ms per token | time to first token |")
    print("|---|---|---|---|")
    for k in rs:
        print(f"| {k} | {med[k]['decode_tps']:.1f} | {1e3 / med[k]['decode_tps']:.1f} | "
              f"{med[k]['ttft'] * 1e3:.0f} ms |")
    two = med[args.strategy]["decode_tps"]
    print(f"\n**2-rank {args.strategy} / single decode: {two / med['single']['decode_tps']:.3f}"
          f"**; overhead per token {1e3 / two - 1e3 / med['single']['decode_tps']:.2f} ms\n")
    print("| rank | layers | compute ms/step | MLX send+recv ms/step | asleep on doorbell "
          "ms/step | bytes read | of weights | peak RSS |")
    print("|---|---|---|---|---|---|---|---|")
    for r, ready_ev in enumerate(ready):
        ev = ready_ev.get("extra", ready_ev)  # a rank's load report
        st = stats[r]  # the timed rounds
        c, m, w = (statistics.median(s[i] for s in st) for i in (1, 2, 3))
        print(f"| {r} | {ev['layers']} | {c:.2f} | {m:.3f} | {w:.2f} | "
              f"{ev['bytes_read'] / 1e6:.0f} MB | {ev['bytes_read'] / weights:.0%} | "
              f"{rss[r] / 2**20:.0f} MiB |")
    print(f"| single | all {n_layers} | | | | | 100% | {rss[-1] / 2**20:.0f} MiB |")


if __name__ == "__main__":
    main()
