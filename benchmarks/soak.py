"""Soak: steady load on a 3-node loopback cluster for a while, then the memory growth of
every node and worker process. Not part of the test suite (it runs for minutes).

Run: .venv/bin/python benchmarks/soak.py [--minutes 30] [--clients 3]
A 3-rank pipeline of the tests' tiny llama, clients sending short chats through every
node (so two of them relay to the owner); RSS sampled once a minute. Prints a markdown
table; docs/benchmarks.md ("Soak") keeps the figures of the last run.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from nodes import NodeProcess, start_cluster, worker_pids  # noqa: E402


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def group_pids(n: NodeProcess) -> dict[str, int]:
    """The node process and its worker, by role."""
    workers = worker_pids(n)
    return {"node": n.proc.pid, **({"worker": workers[0]} if workers else {})}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--clients", type=int, default=3)
    args = p.parse_args()
    import httpx

    from tiny import make_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="shoal-soak-"))
    model = make_tiny_model(tmp / "models" / "tiny-llama")
    nodes = start_cluster(tmp / "cluster", model, 3)
    stop, counts = threading.Event(), {"ok": 0, "failed": 0}
    try:
        ids = [n.client.status().cluster.id for n in nodes]
        r = httpx.post(nodes[0].url + "/shoal/instances", timeout=120, json={
            "model": "tiny-llama", "strategy": "pipeline",
            "nodes": [{"node": ids[0], "layers": [0, 2]}, {"node": ids[1], "layers": [2, 3]},
                      {"node": ids[2], "layers": [3, 4]}]})
        r.raise_for_status()

        def client(i: int) -> None:
            url = nodes[i % 3].url
            with httpx.Client(timeout=60) as http:
                while not stop.is_set():
                    try:
                        r = http.post(url + "/v1/chat/completions", json={
                            "model": "tiny-llama", "max_tokens": 16,
                            "messages": [{"role": "user", "content": f"soak {i}"}]})
                        ok = r.status_code == 200
                    except httpx.HTTPError:  # counted, rather than ending the client
                        ok = False
                    counts["ok" if ok else "failed"] += 1

        threads = [threading.Thread(target=client, args=(i,), daemon=True)
                   for i in range(args.clients)]
        for t in threads:
            t.start()
        pids = [group_pids(n) for n in nodes]
        samples = [[{k: rss_mib(v) for k, v in g.items()} for g in pids]]
        started = time.monotonic()
        end = started + args.minutes * 60
        while time.monotonic() < end:
            time.sleep(min(60, max(0.0, end - time.monotonic())))
            samples.append([{k: rss_mib(v) for k, v in g.items()} for g in pids])
            print(f"{(time.monotonic() - started) / 60:.1f} min: {counts} RSS MiB "
                  + " ".join(f"{k}{i + 1}={v:.0f}" for i, g in enumerate(samples[-1])
                             for k, v in g.items()), flush=True)
        stop.set()
        for t in threads:
            t.join(60)
        elapsed = time.monotonic() - started
    finally:
        for n in nodes:
            n.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    first, last = samples[1] if len(samples) > 2 else samples[0], samples[-1]
    print(f"\n{args.minutes:g} minutes, {args.clients} clients, tiny llama over a 3-rank "
          f"pipeline: {counts['ok']} requests answered, {counts['failed']} failed "
          f"({(counts['ok'] + counts['failed']) / elapsed:.1f} requests/s over "
          f"{elapsed / 60:.1f} minutes).\n")
    print("| node | process | RSS after 1 min (MiB) | RSS at the end (MiB) | growth |")
    print("|---|---|---|---|---|")
    for i, (a, b) in enumerate(zip(first, last)):
        for role in a:
            print(f"| {i + 1} | {role} | {a[role]:.0f} | {b.get(role, 0):.0f} | "
                  f"{b.get(role, 0) - a[role]:+.0f} |")


if __name__ == "__main__":
    main()
