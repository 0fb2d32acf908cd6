"""Real node processes for tests: on free loopback ports, in their own process groups, and
always stopped (with their workers) even when a test fails."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from engine.records import RunnerFailed, RunnerReady, StatusInfo

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    from engine.net import free_listen_port
    return free_listen_port("127.0.0.1")


class NodeProcess:
    """`shoal node` in its own process group, so stopping it reaps its workers too."""

    def __init__(self, home: Path, model: str = "none", *extra: str, port: int | None = None,
                 cluster_port: int | None = None, netns: str | None = None,
                 ip: str = "127.0.0.1", api_key: str | None = None,
                 env: dict[str, str] | None = None):
        self.home, self.extra = home, extra  # enough to start it again the same way
        self.netns, self.ip, self.api_key = netns, ip, api_key
        self.port = port or free_port()
        self.cluster_port = cluster_port or free_port()
        self.url = f"http://{ip}:{self.port}"
        self.cluster_url = f"https://{ip}:{self.cluster_port}"  # where peers reach it (TLS)
        self.log = home / "node-test.log"
        home.mkdir(parents=True, exist_ok=True)
        self._logf = self.log.open("ab")
        # Never the user's keyring: the secret lives in the test's home.
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SHOAL_KEYRING": "0", **(env or {})}
        # The cluster secret goes by environment, as the app gives it: never in argv,
        # where `ps` shows it to every user.
        extra = _secret_to_env(extra, env)
        # In a network namespace `ip netns exec` execs the node: the pid is still the node's.
        prefix = ["ip", "netns", "exec", netns] if netns else []
        if api_key:  # off loopback the API needs one; by environment, as the app gives it
            env["SHOAL_API_KEY"] = api_key
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "engine.cli", "node", "--host", ip,
             "--port", str(self.port), "--home", str(home), "--model", model,
             "--cluster-host", ip, "--cluster-port", str(self.cluster_port), *extra],
            cwd=ROOT, stdout=self._logf, stderr=subprocess.STDOUT, env=env,
            start_new_session=True)
        from engine.client import NodeClient
        self.client = NodeClient(self.url, api_key=api_key, timeout=30)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def wait_healthy(self, timeout: float = 60) -> NodeProcess:
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

    def wait_state(self, state: str, timeout: float = 120) -> StatusInfo:
        deadline = time.monotonic() + timeout
        s = None
        while time.monotonic() < deadline:
            s = self.client.status()
            if s.state == state:
                return s
            time.sleep(0.05)
        raise TimeoutError(f"node state {s} is not {state} after {timeout} s:\n{self.tail()}")

    def wait_ready(self, timeout: float = 120) -> StatusInfo:
        """Until a model is loaded and idle (the state is "idle" before loading starts too,
        so this checks the typed runner state)."""
        deadline = time.monotonic() + timeout
        s = None
        while time.monotonic() < deadline:
            s = self.client.status()
            if isinstance(s.runner, RunnerReady) and s.state == "idle":
                return s
            if isinstance(s.runner, RunnerFailed):
                raise RuntimeError(f"model failed to load: {s.error}\n{self.tail()}")
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


def _secret_to_env(args: tuple[str, ...], env: dict[str, str]) -> tuple[str, ...]:
    out = list(args)
    if "--secret" in out:
        i = out.index("--secret")
        env["SHOAL_SECRET"] = out[i + 1]
        del out[i:i + 2]
    return tuple(out)


def home_with(tmp: Path, model_dir: Path) -> Path:
    home = tmp / "home"
    (home / "models").mkdir(parents=True, exist_ok=True)
    shutil.copytree(model_dir, home / "models" / model_dir.name, dirs_exist_ok=True)
    return home


def start_cluster(root: Path, model_dir: Path, n: int,
                  secret: str = "test-cluster-secret", extra: tuple[str, ...] = (),
                  each: tuple[tuple[str, ...], ...] = ()) -> list[NodeProcess]:
    """n nodes on loopback, each told about the others with --peer, each holding the model
    (and started with `extra` arguments, and node i with `each[i]` too); returns once
    every node sees every other as reachable."""
    from tests_support import wait_until
    cports = [free_port() for _ in range(n)]  # peers meet on their cluster ports
    nodes = []
    try:
        for i in range(n):
            peers = [a for j, p in enumerate(cports) if j != i
                     for a in ("--peer", f"127.0.0.1:{p}")]
            home = home_with(root / f"node{i}", model_dir)
            own = each[i] if i < len(each) else ()
            nodes.append(NodeProcess(home, "none", *peers, "--secret", secret, *extra, *own,
                                     cluster_port=cports[i]))
        for nd in nodes:
            nd.wait_healthy()
        for nd in nodes:
            wait_until(lambda nd=nd: all(p["reachable"] for p in
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


class NetnsLan:
    """A bridge with n network namespaces on it (root and iproute2 only): a small LAN with
    no way out, whose cables can be pulled (`cut`) and plugged back (`mend`). Raises
    OSError or CalledProcessError where namespaces can't be made."""

    def __init__(self, n: int):
        import random
        self.tag = f"sh{os.getpid() % 10000}{random.randint(0, 99)}"
        self.net = f"10.234.{random.randint(1, 250)}"
        self.bridge, self.names = f"{self.tag}br", [f"{self.tag}n{i}" for i in range(n)]
        self.made: list[str] = []
        try:
            self._sh("ip", "link", "add", self.bridge, "type", "bridge")
            self._sh("ip", "addr", "add", f"{self.net}.254/24", "dev", self.bridge)
            self._sh("ip", "link", "set", self.bridge, "up")
            for i, ns in enumerate(self.names):
                self._sh("ip", "netns", "add", ns)
                self.made.append(ns)
                self._sh("ip", "link", "add", self.veth(i), "type", "veth", "peer", "name",
                         "eth0", "netns", ns)
                self._sh("ip", "link", "set", self.veth(i), "master", self.bridge)
                self._sh("ip", "link", "set", self.veth(i), "up")
                self._sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.ip(i)}/24",
                         "dev", "eth0")
                self._sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
                self._sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _sh(*cmd: str) -> None:
        subprocess.run(cmd, check=True, capture_output=True, timeout=20)

    def ip(self, i: int) -> str:
        return f"{self.net}.{i + 1}"

    def veth(self, i: int) -> str:
        return f"{self.tag}v{i}"  # the host's end of namespace i's cable

    def cut(self, i: int) -> None:
        """Namespace i loses its cable: packets to and from it vanish, nothing is reset."""
        self._sh("ip", "link", "set", self.veth(i), "down")

    def mend(self, i: int) -> None:
        self._sh("ip", "link", "set", self.veth(i), "up")

    def partition(self, i: int, j: int, heal: bool = False) -> None:
        """Namespaces i and j lose the path between them (packets vanish) while both keep
        their cables to everyone else; `heal` gives it back."""
        for a, b in ((i, j), (j, i)):
            self._sh("ip", "netns", "exec", self.names[a], "ip", "route",
                     "del" if heal else "add", "blackhole", f"{self.ip(b)}/32")

    def close(self) -> None:
        for ns in self.made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=20)


def memory_limit_gb(model_dir: Path) -> float:
    """A --memory-limit (GB) between the memory one node needs for the model and what
    each of two needs: it fits on two nodes, never one (the healing tests and benchmark)."""
    from engine.hub.checkpoint import memory_bytes
    from engine.node.planning import plan_from_cluster
    config = json.loads((model_dir / "config.json").read_text())
    facts = {"model_config": config, "weight_bytes": memory_bytes(model_dir, config)}
    infos = [{"id": n, "name": n, "memory_usable_bytes": 100e9} for n in ("a", "b")]
    layers = config["num_hidden_layers"]

    def need(split: list[dict]) -> float:
        report = plan_from_cluster(infos[:len(split)], **facts,
                                   layout=("pipeline", "ring", split))
        return max(r.memory.total for r in report.placements[0].ranks)
    one = need([{"node": "a", "layers": [0, layers]}])
    two = need([{"node": "a", "layers": [0, layers // 2]},
                {"node": "b", "layers": [layers // 2, layers]}])
    if two >= one:
        raise ValueError(f"{model_dir.name}: two nodes need no less than one")
    return (one + two) / 2 / 1e9
