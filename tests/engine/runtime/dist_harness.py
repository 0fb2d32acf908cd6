"""Real worker processes for the distributed tests and benchmark: one-process workers and
groups of ranks on 127.0.0.1, each in its own process group so nothing outlives a test."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (held open together so they can't repeat)."""
    from engine.net import free_listen_port

    socks = []
    try:
        for _ in range(n):  # outside the ephemeral range: busy clients can't take them
            s = socket.socket()
            s.bind(("127.0.0.1", free_listen_port("127.0.0.1")))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Worker:
    """One worker process; its stdout events land in a queue."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None,
                 prefix: list[str] | None = None):
        from engine.platform.cpu import worker_env

        self.log = log
        self._logf = log.open("ab")
        self.proc = subprocess.Popen(
            [*(prefix or []), sys.executable, "-m", "engine.runtime.worker", *args], cwd=ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._logf,
            env=env or worker_env(), start_new_session=True)
        self.events: queue.Queue[dict | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout
        for line in self.proc.stdout:
            self.events.put(json.loads(line))
        self.events.put(None)

    def send(self, cmd: dict[str, Any]) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(json.dumps(cmd).encode() + b"\n")
        self.proc.stdin.flush()

    def expect(self, pred: Callable[[dict], bool], timeout: float = 60) -> dict:
        """The first event matching `pred`; a fatal or the end of the stream fails."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                ev = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"no matching event in {timeout} s:\n{self.tail()}") from None
            if ev is None:
                raise RuntimeError(f"worker exited ({self.proc.poll()}):\n{self.tail()}")
            if pred(ev):
                return ev
            if ev["ev"] == "fatal":
                raise RuntimeError(f"fatal: {ev}\n{self.tail()}")

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(10)
        self._logf.close()


def generate(w: Worker, rid: str, messages: list[dict], timeout: float = 120,
             **sampling: Any) -> list[dict]:
    """Send one request and return its events, accepted … done|error."""
    w.send({"op": "generate", "id": rid,
            "request": {"messages": messages, "sampling": sampling}})
    return collect(w, rid, timeout)


def collect(w: Worker, rid: str, timeout: float = 120) -> list[dict]:
    out: list[dict] = []
    while True:
        ev = w.expect(lambda e: e.get("id") == rid, timeout)
        out.append(ev)
        if ev["ev"] in ("done", "error"):
            return out


def texts(events: list[dict]) -> list[str]:
    """The text of every token event, then the final one: token-for-token output."""
    return [e["text"] for e in events if e["ev"] == "delta"]


class Group:
    """`world` ranks serving `model` together; rank 0 is `self.ranks[0]`."""

    def __init__(self, tmp: Path, model: Path, world: int, strategy: str,
                 layers: list[list[int]] | None = None, timeout_s: float = 20,
                 env: dict[str, str] | None = None, prefix_cache_tokens: int = 8192,
                 streams: int = 1, lanes: int = 1, prefix: list[str] | None = None,
                 args: tuple[str, ...] = (), kv_bits: int | None = None):
        ports = free_ports(2 * world)
        self.config = {"world": world, "backend": "ring", "strategy": strategy,
                       "hosts": [f"127.0.0.1:{p}" for p in ports[:world]],
                       "bells": [f"127.0.0.1:{p}" for p in ports[world:]],
                       "layers": layers or [], "timeout_s": timeout_s,
                       "prefix_cache_tokens": prefix_cache_tokens, "lanes": lanes,
                       "kv_bits": kv_bits}
        tmp.mkdir(parents=True, exist_ok=True)
        self.ranks: list[Worker] = []
        for r in range(world):
            cfg = tmp / f"rank{r}.json"
            cfg.write_text(json.dumps({**self.config, "rank": r}))
            self.ranks.append(Worker(["--model", str(model), "--model-id", "m",
                                      "--dist", str(cfg), "--streams", str(streams),
                                      *args],
                                     tmp / f"rank{r}.log", env, prefix))

    @property
    def leader(self) -> Worker:
        return self.ranks[0]

    def ready(self, timeout: float = 90) -> list[dict]:
        return [w.expect(lambda e: e["ev"] == "ready", timeout) for w in self.ranks]

    def exit_codes(self, timeout: float) -> list[int | None]:
        deadline = time.monotonic() + timeout
        for w in self.ranks:
            try:
                w.proc.wait(max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        return [w.proc.poll() for w in self.ranks]

    def shutdown(self, timeout: float = 15) -> list[int | None]:
        """Ask rank 0 to shut down; every rank's exit code (None: still running)."""
        try:
            self.leader.send({"op": "shutdown"})
        except (BrokenPipeError, OSError):
            pass
        return self.exit_codes(timeout)

    def kill(self) -> None:
        for w in self.ranks:
            w.kill()


def send_all(leader: Worker, requests: list, tag: str) -> None:
    for i, (msgs, s) in enumerate(requests):
        leader.send({"op": "generate", "id": f"{tag}{i}",
                     "request": {"messages": msgs, "sampling": s}})


def collect_all(leader: Worker, ids: list[str], timeout: float = 120) -> dict[str, list]:
    """Every event of several requests in flight at once, in arrival order per request,
    with the time each arrived."""
    got: dict[str, list] = {i: [] for i in ids}
    left = set(ids)
    while left:
        ev = leader.expect(lambda e: e.get("id") in left, timeout)
        ev["t"] = time.monotonic()
        got[ev["id"]].append(ev)
        if ev["ev"] in ("done", "error"):
            left.discard(ev["id"])
    return got


def overlapped_steps(rank0: Worker, timeout: float = 10) -> int:
    """Rank 0's count, from the stats line it logs as the round ends, of its steps run
    while another lane's step was on the next ranks."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.findall(r"rank 0 request stats: .* overlapped_steps=(\d+)",
                           rank0.log.read_text(errors="replace"))
        if found:
            return int(found[-1])
        time.sleep(0.1)
    raise AssertionError("rank 0 logged no request stats")
