"""Validation of the performance model: predicted vs measured decode tokens/s for the
loopback clusters of benchmarks/distributed.py (single process and 2-rank pipeline on this
machine), with the node's own calibration and a measured loopback hop; first, predicted
against the published tensor-parallel figures for big MoE models on M3 Ultra Mac Studios
that docs/placement.md cites (pure arithmetic, no hardware).

Run: .venv/bin/python benchmarks/plan_validation.py [--model smollm2 wide-llama]
     [--published-only]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def loopback_hop() -> tuple[float, float]:
    """One-way latency (half the best round trip of a 4 KiB message) and bandwidth of a
    loopback TCP connection, as MLX's ring sees it."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def echo() -> None:
        c, _ = srv.accept()
        with c, contextlib.suppress(OSError):  # the client hangs up mid-stream at the end
            while data := c.recv(1 << 20):
                c.sendall(data[:1] if len(data) > 4096 else data)
    threading.Thread(target=echo, daemon=True).start()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        msg, best = b"x" * 4096, 1.0
        for _ in range(200):
            t = time.perf_counter()
            s.sendall(msg)
            got = 0
            while got < len(msg):
                got += len(s.recv(65536))
            best = min(best, time.perf_counter() - t)
        big = b"y" * (64 << 20)
        t = time.perf_counter()
        s.sendall(big)
        s.recv(1)
        bw = len(big) / (time.perf_counter() - t)
    srv.close()
    return best / 2, bw


def measured(model: str) -> dict[str, float]:
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "distributed.py"),
                          "--model", model, "--tokens", "128", "--rounds", "5"],
                         capture_output=True, text=True, timeout=1800)
    out = run.stdout
    rows = dict(re.findall(r"^\| (single|pipeline) \| ([\d.]+) \|", out, re.M))
    if set(rows) != {"single", "pipeline"}:  # the tok/s table comes first: a later
        raise RuntimeError(f"distributed.py {model}: no tok/s table (exit "  # failure
                           f"{run.returncode}): {run.stderr[-2000:]}")  # is only reported
    if run.returncode:
        print(f"(distributed.py {model} exited {run.returncode} after its tok/s table: "
              f"{run.stderr.strip().splitlines()[-1] if run.stderr.strip() else ''})",
              file=sys.stderr)
    split = re.search(r"split at layer (\d+)", out)
    return {"single": float(rows["single"]), "pipeline": float(rows["pipeline"]),
            "split": int(split.group(1)) if split else 0}


def predicted(folder: Path, split: int, bw: float, flops: float, hop: tuple[float, float]
              ) -> dict[str, float]:
    from engine.placement.model import LinkSpec, ModelSpec, NodeSpec
    from engine.placement.planner import evaluate
    from engine.placement.tables import DEFAULT
    config = json.loads((folder / "config.json").read_text())
    config.pop("quantization", None)  # the CPU worker runs float32 (cpu_fast_path)
    spec = ModelSpec.from_config(config, bytes_per_param=4.0, name=folder.name)
    # measured figures are what a step gets: undo the factors applied to peak figures
    mk = lambda i: NodeSpec(f"rank{i}", f"rank{i}", 20 << 30,  # noqa: E731
                            bw / DEFAULT.bandwidth_efficiency,
                            flops / DEFAULT.compute_efficiency)
    nodes = [mk(0), mk(1)]
    links = [LinkSpec("rank0", "rank1", hop[0], hop[1], False)]
    layers = config["num_hidden_layers"]
    one = evaluate(spec, nodes[:1], [], 512, "pipeline", [{"node": "rank0",
                                                          "layers": [0, layers]}])
    two = evaluate(spec, nodes, links, 512, "pipeline",
                   [{"node": "rank0", "layers": [0, split]},
                    {"node": "rank1", "layers": [split, layers]}])
    return {"single": one.decode_tps, "pipeline": two.decode_tps}


# Published decode tokens/s, tensor parallel over Thunderbolt 5 RDMA on 512 GB M3 Ultra Mac
# Studios: (profile, quantization, Macs, tokens/s or None where none is cited, source)
PUBLISHED = [
    ("Qwen3-235B-A22B", "8bit", 2, None, ""), ("Qwen3-235B-A22B", "8bit", 4, None, ""),
    ("DeepSeek-V3.1", "8bit", 2, None, ""),
    ("DeepSeek-V3.1", "8bit", 4, 25.0, "exo over RDMA, one report"),
    ("Kimi-K2", "4bit", 2, None, ""),
    ("Kimi-K2", "4bit", 4, 34.0, "exo over RDMA, the same report"),
    ("Kimi-K2", "4bit", 4, 28.0, "LM Studio demo (Kimi K2.6), other software"),
]


def published() -> None:
    """Predicted against published figures, as a markdown table."""
    from engine import placement_profiles
    from engine.placement.planner import evaluate
    from engine.placement.profiles import links_from, node_from, profile_model
    machines = placement_profiles.machines()
    nodes = [node_from({"name": f"studio-{i + 1}", "profile": "mac-studio-m3-ultra",
                        "memory_gb": 512, "rdma": True}, f"nodes[{i}]", machines)
             for i in range(4)]
    links = links_from({"mesh": "thunderbolt5-rdma"}, "links[0]", machines,
                       [nd.id for nd in nodes])
    print("| model | Macs | published tok/s | predicted tok/s | predicted / published | "
          "source |")
    print("|---|---|---|---|---|---|")
    for name, quant, macs, tps, source in PUBLISHED:
        spec = profile_model(placement_profiles.models()["models"][name], name, quant,
                             "quant")
        p = evaluate(spec, nodes[:macs], links, 32768, "tensor",
                     [nd.id for nd in nodes[:macs]], "jaccl")
        print(f"| {spec.name} | {macs} | {tps or 'none cited'} | {p.decode_tps:.1f} | "
              f"{f'{p.decode_tps / tps:.2f}' if tps else '–'} | {source or '–'} |")
    print()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", nargs="+", default=["smollm2", "wide-llama", "wide-moe"])
    ap.add_argument("--published-only", action="store_true",
                    help="only the published Mac figures (no loopback runs)")
    a = ap.parse_args()
    published()
    if a.published_only:
        return
    from benchmarks_distributed import make_model  # type: ignore[import-not-found]

    from engine.platform.cpu import worker_env
    from engine.telemetry.calibrate import measure
    cal = measure(worker_env())
    hop = loopback_hop()
    print(f"calibration: {cal['memory_bandwidth_Bps'] / 1e9:.1f} GB/s, "
          f"{cal['compute_flops'] / 1e9:.0f} GFLOP/s; loopback hop {hop[0] * 1e6:.0f} µs, "
          f"{hop[1] / 1e9:.1f} GB/s\n")
    print("| model | path | predicted tok/s | measured tok/s | predicted / measured |")
    print("|---|---|---|---|---|")
    for m in a.model:
        got = measured(m)
        with tempfile.TemporaryDirectory() as tmp:
            folder = make_model(m, Path(tmp))
            want = predicted(folder, got["split"], cal["memory_bandwidth_Bps"],
                             cal["compute_flops"], hop)
        for path in ("single", "pipeline"):
            print(f"| {m} | {path} | {want[path]:.1f} | {got[path]:.1f} | "
                  f"{want[path] / got[path]:.2f} |")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import importlib
    sys.modules["benchmarks_distributed"] = importlib.import_module("distributed")
    main()
