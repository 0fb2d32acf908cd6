"""Benchmark: one model into an empty Hugging Face cache, three ways:
  1. from the test Hub server throttled to a home-internet rate (default 50 Mbit/s),
  2. from the same server unthrottled on loopback (what the download code itself costs),
  3. from a neighbour node on loopback: two real `shoal node` processes, the second pulls
     through POST /shoal/hub/pull and gets the files from the first (signed, hash-checked).

Run: .venv/bin/python benchmarks/downloads.py [--mbit 50] [--mb 64]
Prints a markdown table; docs/benchmarks.md ("Downloads") keeps the figures of the last run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "engine" / "hub_dl"))
PLUGIN = ROOT / "tests" / "engine" / "hub_dl" / "node_plugin"  # hub routes for test nodes
REPO = "bench-org/wide-llama"


def make_model(tmp: Path, mb: int) -> Path:
    """The tests' llama architecture, widened to about `mb` MB of float32, in 3 shards."""
    from hub_models import shard_model

    from tiny import LLAMA, make_tiny_model
    layers = max(2, round(mb / 16))  # ~16 MB per layer at this width
    folder = make_tiny_model(tmp / "wide", LLAMA, hidden_size=512, intermediate_size=2048,
                             num_attention_heads=4, num_key_value_heads=2,
                             num_hidden_layers=layers)
    third = max(1, layers // 3)
    groups = [["model.embed_tokens"] + [f"model.layers.{i}." for i in range(third)],
              [f"model.layers.{i}." for i in range(third, layers)],
              ["model.norm", "lm_head"]]
    return shard_model(folder, groups)


def timed_pull(cache: Path) -> float:
    from engine.hub.download import pull
    t0 = time.perf_counter()
    pull(REPO, cache_dir=cache)
    return time.perf_counter() - t0


def neighbour_copy(tmp: Path, have: Path, want: Path) -> tuple[list[float], list[str]]:
    from nodes import NodeProcess, free_port
    from tests_support import wait_until
    env = dict(os.environ)
    os.environ["PYTHONPATH"] = f"{PLUGIN}{os.pathsep}{ROOT}"
    os.environ["SHOAL_MDNS"] = "off"
    ports = [free_port(), free_port()]
    nodes = []
    try:
        for i, cache in enumerate((have, want)):
            os.environ["HF_HUB_CACHE"] = str(cache)
            nodes.append(NodeProcess(tmp / f"node{i}", "none", "--peer",
                                     f"127.0.0.1:{ports[1 - i]}", "--secret", "bench",
                                     port=ports[i]))
        for n in nodes:
            n.wait_healthy()
        c = nodes[1].client
        wait_until(lambda: all(p.trusted and p.link.measured for p in c.peers()), 60)
        times = []
        for _ in range(2):  # the first one pays the node's first huggingface_hub import
            t0 = time.perf_counter()
            d = c.hub_pull(REPO)
            while d.state == "running":
                time.sleep(0.02)
                d = next(x for x in c.hub_downloads() if x.id == d.id)
            times.append(time.perf_counter() - t0)
            if d.state != "done":
                raise RuntimeError(json.dumps(d.to_json()))
            c.remove_model(REPO)
        return times, sorted({f.source for f in d.progress.files})
    finally:
        for n in nodes:
            n.stop()
        os.environ.clear()
        os.environ.update(env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mbit", type=float, default=50.0, help="home line, Mbit/s")
    ap.add_argument("--mb", type=int, default=64, help="model size, MB")
    a = ap.parse_args()
    from hubserver import HubServer
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        model = make_model(tmp, a.mb)
        size = sum(p.stat().st_size for p in model.iterdir())
        nfiles = len(list(model.iterdir()))
        with HubServer() as hub:
            hub.add_repo(REPO, model)
            os.environ["HF_ENDPOINT"] = hub.url
            os.environ.pop("HF_HUB_OFFLINE", None)
            hub.rate_bps = a.mbit * 1e6 / 8
            home = timed_pull(tmp / "cache-home")
            hub.rate_bps = None
            loop = timed_pull(tmp / "cache-loopback")
            hub.reset_counters()
            peer, sources = neighbour_copy(tmp, tmp / "cache-home", tmp / "cache-peer")
            hub_bytes = hub.served()
    rows = [(f"Hub server throttled to {a.mbit:g} Mbit/s", home),
            ("Hub server, loopback, unthrottled", loop),
            ("neighbour node over loopback, first pull after the node started", peer[0]),
            ("neighbour node over loopback, next pull", peer[1])]
    print(f"model: {size / 1e6:.1f} MB in {nfiles} files "
          f"(3 safetensors shards); neighbour copy sources: {', '.join(sources)}; "
          f"bytes the Hub served during it: {hub_bytes}\n")
    print("| source | time | MB/s |")
    print("|---|---|---|")
    for name, t in rows:
        print(f"| {name} | {t:.2f} s | {size / t / 1e6:.1f} |")


if __name__ == "__main__":
    main()
