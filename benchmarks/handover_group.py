"""Benchmark: time to first token on a pipeline group with its prompts prefilled on a node
outside it (the KV handed to both ranks' nodes) against prefilled by the group itself.

Three real node processes on loopback: A and C serve the model as a two-rank pipeline
(A rank 0), B prefills for it. A is pinned to core 0, B and C share core 1 (this machine
has two): what it shows is what the hand-over to a group costs beyond the prefill there
(B's frames stream into A's folder and on to C's as they come; once both copies are whole
every rank reads its own at the same step), not a speed-up, which needs a faster prefill
node (an NVIDIA GPU). For each prompt length, a fresh prompt on the group alone, then
another of the same length with the split, in the same run.

Model: a random-weight 4-layer model with a 40,000-token context (the --tiny one of
benchmarks/handover.py).

With --prefill-group the other way round: A decodes alone, B and C prefill for it as a
two-rank pipeline (B rank 0, on core 1 with C: the group's ranks share one core).

Run: .venv/bin/python benchmarks/handover_group.py [--tokens 1000,8000,32000]
     [--prefill-group]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from handover import handed as one_handed  # noqa: E402
from handover import prompt, ttft  # noqa: E402

from nodes import start_cluster  # noqa: E402


def handed(log: Path) -> tuple[float, ...] | None:
    """(MB, prefill s there, both copies whole s after it, taken in s after that) of the
    last hand-over in A's log."""
    found = re.findall(r"for the group \(\d+ ranks\): ([\d.]+) MB; prefill ([\d.]+) s "
                       r"there, every copy whole ([\d.]+) s after it, taken in ([\d.]+) s",
                       log.read_text())
    return tuple(float(x) for x in found[-1]) if found else None


def main() -> None:
    import httpx

    p = argparse.ArgumentParser()
    p.add_argument("--tokens", default="1000,8000,32000")
    p.add_argument("--prefill-group", action="store_true",
                   help="the other way round: A decodes alone, B and C prefill as a "
                        "two-rank pipeline (B rank 0)")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-handover-group-"))
    rows: list[dict[str, Any]] = []
    try:
        from tiny import make_tiny_model
        folder = make_tiny_model(tmp / "models" / "tiny-long", hidden_size=256,
                                 num_attention_heads=4, num_key_value_heads=2,
                                 max_position_embeddings=40000)
        model = folder.name
        a, b, c = nodes = start_cluster(tmp / "trio", folder, 3)
        try:
            if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
                for n, core in ((a, 0), (b, 1), (c, 1)):
                    os.sched_setaffinity(n.proc.pid, {core})
            bid, cid = (n.client.status().cluster.id for n in (b, c))
            group = {"model": model, "strategy": "pipeline", "nodes": [
                {"node": "self", "layers": [0, 2]}, {"node": cid, "layers": [2, 4]}]}
            if args.prefill_group:  # B and C prefill, A decodes alone
                httpx.post(b.url + "/shoal/instances", timeout=900,
                           json=group).raise_for_status()
                group = {"model": model, "nodes": [{"node": "self"}]}
            else:
                httpx.post(b.url + "/shoal/instances", timeout=900, json={
                    "model": model, "nodes": [{"node": "self"}]}).raise_for_status()
            for n_tokens in (int(x) for x in args.tokens.split(",")):
                httpx.post(a.url + "/shoal/instances", timeout=900,
                           json=group).raise_for_status()
                alone = ttft(a.url, model, prompt(n_tokens, n_tokens, 5))
                httpx.post(a.url + "/shoal/instances", timeout=900, json={
                    **group, "prefill": bid, "prefill_min": 256}).raise_for_status()
                split = ttft(a.url, model, prompt(n_tokens, n_tokens + 1, 5))
                rows.append({"tokens": alone[1], "alone": alone[0], "split": split[0],
                             "cached": split[2], "handed": handed(a.log)
                             or one_handed(a.log)})
                print(rows[-1], flush=True)
        finally:
            for n in nodes:
                n.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.prefill_group:
        print(f"\n{model}: A decodes alone (core 0); B and C prefill for it as a two-rank "
              "pipeline (both on core 1).\n")
        print("| prompt tokens | TTFT A alone (s) | TTFT split (s) | KV | rank 0's part "
              "there (s) | last frame after it (s) | adopted after that (s) |")
    else:
        print(f"\n{model}, a two-rank pipeline (A core 0, C core 1) and its prefill node "
              "(B, core 1) on one machine.\n")
        print("| prompt tokens | TTFT group alone (s) | TTFT split (s) | KV | prefill there "
              "(s) | both copies whole after it (s) | taken in after that (s) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        mb, there, tail, took = r["handed"] or (0.0, 0.0, 0.0, 0.0)
        print(f"| {r['tokens']} | {r['alone']:.2f} | {r['split']:.2f} ({r['cached']} "
              f"cached) | {mb:.0f} MB | {there:.2f} | {tail:.2f} | {took:.2f} |")


if __name__ == "__main__":
    main()
