"""Healing: seconds from a node's SIGKILL to the model serving again, for the planner's
own split and for a split dragged by hand (and for a node that quits politely).

Run: .venv/bin/python benchmarks/healing.py [--rounds 3]
Three nodes on loopback hold tiny-llama (4 layers); every node's --memory-limit lies
between what one node alone and what each of two would need, so no placement is a single
node and the heal must split again. Each round launches the placement (the planner's: a
launch without nodes; the hand split: layers [0, 2], [2, 3], [3, 4] over the three), kills
a node holding part of it (never the owner) with SIGKILL, workers and all (or asks it to
quit with SIGTERM), and asks the owner for a one-token answer every 0.1 s until one comes
back. Then the lost node is started again for the next round. Prints a markdown table:
what a client waits (the signal to the first answer), the owner's own count (from noticing
to serving) and its estimate while it placed the model again.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from nodes import NodeProcess, memory_limit_gb, start_cluster  # noqa: E402

HELLO = [{"role": "user", "content": "Hello"}]


def answers(node: NodeProcess) -> bool:
    import httpx
    try:
        return httpx.post(node.url + "/v1/chat/completions", timeout=30, json={
            "model": "tiny-llama", "messages": HELLO, "max_tokens": 1,
            "temperature": 0}).status_code == 200
    except httpx.HTTPError:
        return False


def healing(node: NodeProcess) -> dict:
    return node.client._call("GET", "/shoal/instances").get("healing") or {}


def one_round(nodes: list[NodeProcess], body: dict, sig: signal.Signals
              ) -> tuple[float, float, float]:
    """(kill to first answer, the owner's count, its estimate), in seconds."""
    import httpx
    a = nodes[0]
    r = httpx.post(a.url + "/shoal/instances", json=body, timeout=300)
    if r.status_code != 201:
        raise RuntimeError(f"the launch failed: {r.text}")
    ranks = [x["node"] for x in r.json()["ranks"]]
    ids = [n.client.status().cluster.id for n in nodes]
    victim = next(i for i, nid in enumerate(ids) if nid in ranks[1:])
    assert answers(a)
    killed = time.monotonic()
    if sig == signal.SIGKILL:  # the node and its workers, as a machine that dies
        os.killpg(nodes[victim].proc.pid, sig)
    else:  # the node quits as it does when asked (SIGTERM, the app's Quit)
        nodes[victim].proc.send_signal(sig)
    estimate = None
    while not (healing(a).get("state") == "serving" and answers(a)):
        estimate = estimate or healing(a).get("estimate_s")
        if healing(a).get("state") in ("doesnt_fit", "failed"):
            raise RuntimeError(healing(a)["message"])
        if time.monotonic() - killed > 180:
            raise TimeoutError(f"not serving again after 180 s: {healing(a)}")
        time.sleep(0.1)
    waited = time.monotonic() - killed
    print(f"{body.get('nodes') and 'hand' or 'planner'} {sig.name}: {ranks} lost "
          f"{ids[victim]}: {waited:.1f} s", file=sys.stderr)
    v = nodes[victim]
    v.stop()
    nodes[victim] = NodeProcess(v.home, "none", *v.extra, port=v.port,
                                cluster_port=v.cluster_port).wait_healthy()
    deadline = time.monotonic() + 120
    while not all(p["reachable"] for p in a.client._call("GET", "/shoal/peers")):
        if time.monotonic() > deadline:
            raise TimeoutError("the killed node didn't come back")
        time.sleep(0.2)
    return waited, healing(a).get("seconds") or 0.0, estimate or 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("SHOAL_CALIBRATE", "0")  # a second of full CPU per node start
    from tiny import make_tiny_model
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_model(Path(tmp) / "models" / "tiny-llama")
        limit = memory_limit_gb(model)
        nodes = start_cluster(Path(tmp) / "cluster", model, 3,
                              extra=("--memory-limit", f"{limit:.6f}"))
        try:
            ids = [n.client.status().cluster.id for n in nodes]
            hand = {"model": "tiny-llama", "strategy": "pipeline",
                    "nodes": [{"node": "self", "layers": [0, 2]},
                              {"node": ids[1], "layers": [2, 3]},
                              {"node": ids[2], "layers": [3, 4]}]}
            cases = {
                "planner's split, SIGKILL": ({"model": "tiny-llama"}, signal.SIGKILL),
                "hand split [0,2] [2,3] [3,4], SIGKILL": (hand, signal.SIGKILL),
                "hand split, the node quits (SIGTERM)": (hand, signal.SIGTERM)}
            results: dict[str, list[tuple[float, float, float]]] = {k: [] for k in cases}
            for _ in range(args.rounds):
                for name, (body, sig) in cases.items():  # interleaved: drift falls on all
                    results[name].append(one_round(nodes, body, sig))
        finally:
            for n in nodes:
                n.stop()
    print(f"\n{args.rounds} rounds each, 3 tiny-llama nodes on loopback "
          f"(--memory-limit {limit:.4f} GB each)\n")
    print("| placement, how the node went | signal → first answer, s (median, min-max) "
          "| owner's count, s "
          "| its estimate, s |")
    print("|---|---|---|---|")
    for name, rows in results.items():
        waited = [w for w, _, _ in rows]
        print(f"| {name} | {statistics.median(waited):.1f} ({min(waited):.1f}-"
              f"{max(waited):.1f}) | {statistics.median(c for _, c, _ in rows):.1f} | "
              f"{statistics.median(e for _, _, e in rows):.0f} |")


if __name__ == "__main__":
    main()
