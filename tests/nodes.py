"""Real node processes for tests: on free loopback ports, in their own process groups, and
always stopped (with their workers) even when a test fails."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NodeProcess:
    """`shoal node` in its own process group, so stopping it reaps its workers too."""

    def __init__(self, home: Path, model: str = "none", *extra: str, port: int | None = None,
                 cluster_port: int | None = None):
        self.home, self.extra = home, extra  # enough to start it again the same way
        self.port = port or free_port()
        self.cluster_port = cluster_port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cluster_url = f"http://127.0.0.1:{self.cluster_port}"  # where peers reach it
        self.log = home / "node-test.log"
        home.mkdir(parents=True, exist_ok=True)
        self._logf = self.log.open("ab")
        # Never the user's keyring: the secret lives in the test's home.
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SHOAL_KEYRING": "0"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.cli", "node", "--host", "127.0.0.1",
             "--port", str(self.port), "--home", str(home), "--model", model,
             "--cluster-host", "127.0.0.1", "--cluster-port", str(self.cluster_port), *extra],
            cwd=ROOT, stdout=self._logf, stderr=subprocess.STDOUT, env=env,
            start_new_session=True)
        from engine.client import NodeClient
        self.client = NodeClient(self.url, timeout=30)

    def wait_healthy(self, timeout: float = 60) -> "NodeProcess":
        from engine.errors import PeerUnreachable
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                self.client.health()
                return self
            except PeerUnreachable:
                time.sleep(0.1)
        raise TimeoutError(f"node not healthy after {timeout} s:\n{self.tail()}")

    def wait_state(self, state: str, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        s: dict = {}
        while time.monotonic() < deadline:
            s = self.client.status()
            if s["state"] == state:
                return s
            time.sleep(0.05)
        raise TimeoutError(f"node state {s} is not {state} after {timeout} s:\n{self.tail()}")

    def wait_ready(self, timeout: float = 120) -> dict:
        """Until a model is loaded and idle (the state is "idle" before loading starts too,
        so this checks the typed runner state)."""
        deadline = time.monotonic() + timeout
        s: dict = {}
        while time.monotonic() < deadline:
            s = self.client.status()
            if s["runner"]["type"] == "Ready" and s["state"] == "idle":
                return s
            if s["runner"]["type"] == "Failed":
                raise RuntimeError(f"model failed to load: {s['error']}\n{self.tail()}")
            time.sleep(0.05)
        raise TimeoutError(f"node not ready after {timeout} s: {s}\n{self.tail()}")

    def tail(self, n: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        wlog = self.home / "logs" / "worker.log"
        if wlog.exists():
            text += "\n--- worker.log ---\n" + wlog.read_text(errors="replace")
        return "\n".join(text.splitlines()[-n:])

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
        try:  # whatever is left in the group (a stuck worker) goes too
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(10)
        self._logf.close()


def home_with(tmp: Path, model_dir: Path) -> Path:
    home = tmp / "home"
    (home / "models").mkdir(parents=True, exist_ok=True)
    shutil.copytree(model_dir, home / "models" / model_dir.name, dirs_exist_ok=True)
    return home


def start_cluster(root: Path, model_dir: Path, n: int,
                  secret: str = "test-cluster-secret") -> list[NodeProcess]:
    """n nodes on loopback, each told about the others with --peer, each holding the model;
    returns once every node sees every other as reachable."""
    from tests_support import wait_until
    cports = [free_port() for _ in range(n)]  # peers meet on their cluster ports
    nodes = []
    try:
        for i in range(n):
            peers = [a for j, p in enumerate(cports) if j != i
                     for a in ("--peer", f"127.0.0.1:{p}")]
            home = home_with(root / f"node{i}", model_dir)
            nodes.append(NodeProcess(home, "none", *peers, "--secret", secret,
                                     cluster_port=cports[i]))
        for nd in nodes:
            nd.wait_healthy()
        for nd in nodes:
            wait_until(lambda: all(p["reachable"] for p in
                                   nd.client._call("GET", "/shoal/peers")), 20)
    except BaseException:
        for nd in nodes:
            nd.stop()
        raise
    return nodes


def worker_pids(n: NodeProcess) -> list[int]:
    """Live worker processes in the node's process group."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[2]) == n.proc.pid and b"engine.runtime.worker" in cmd and stat[0] != "Z":
            pids.append(int(d.name))
    return pids
