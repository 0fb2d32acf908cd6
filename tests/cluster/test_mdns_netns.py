"""Real mDNS between three network namespaces this test creates (root only): nodes find
each other with no configuration, a node that leaves is noticed, and it rejoins as the
same node. Multicast stays inside the test's own namespaces and bridge."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from nodes import ROOT
from tests_support import wait_until

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="needs root and iproute2 to create network namespaces")


KEY = {"Authorization": "Bearer lan-key"}


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=20)


@pytest.fixture
def lan():
    """A bridge with three namespaces on it: a small LAN with no way out."""
    tag = f"sh{os.getpid() % 10000}{random.randint(0, 99)}"
    net = f"10.233.{random.randint(1, 250)}"
    br = f"{tag}br"
    try:
        sh("ip", "link", "add", br, "type", "bridge")
    except subprocess.CalledProcessError as e:
        pytest.skip(f"can't create a bridge here: {e.stderr.decode().strip()}")
    names = []
    try:
        snoop = Path(f"/sys/class/net/{br}/bridge/multicast_snooping")
        if snoop.exists():
            snoop.write_text("0")  # let mDNS through without IGMP reports
        sh("ip", "addr", "add", f"{net}.254/24", "dev", br)
        sh("ip", "link", "set", br, "up")
        for i in (1, 2, 3):
            ns, veth = f"{tag}n{i}", f"{tag}v{i}"
            sh("ip", "netns", "add", ns)
            names.append(ns)
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0",
               "netns", ns)
            sh("ip", "link", "set", veth, "master", br)
            sh("ip", "link", "set", veth, "up")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{net}.{i}/24", "dev", "eth0")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield net, names
    finally:
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
        subprocess.run(["ip", "link", "del", br], capture_output=True, timeout=20)


class NsNode:
    def __init__(self, ns: str, ip: str, home: Path):
        self.ns, self.ip, self.home = ns, ip, home
        self.url = f"http://{ip}:8421"
        self.cluster_url = f"https://{ip}:8422"  # the peers' view of it (TLS)
        self.start()

    def start(self) -> None:
        self.log = (self.home.parent / f"{self.ns}.log").open("ab")
        env = {**os.environ, "SHOAL_KEYRING": "0", "SHOAL_MDNS": "on"}
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, sys.executable, "-m", "engine.cli", "node",
             "--host", self.ip, "--port", "8421", "--home", str(self.home), "--model", "none",
             "--secret", "lan-secret", "--mdns", "on", "--mdns-interface", self.ip,
             "--api-key", "lan-key",  # off loopback, the user API needs a key
             "--cluster-host", self.ip],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def peers(self) -> dict[str, dict]:
        r = httpx.get(self.url + "/shoal/peers", timeout=5, headers=KEY)
        return {p["url"]: p for p in r.json()}

    def node_id(self) -> str:
        return httpx.get(self.url + "/shoal/status", timeout=5,
                         headers=KEY).json()["cluster"]["id"]

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(10)
        self.log.close()


def test_nodes_find_each_other_notice_a_leaver_and_see_it_rejoin(lan, tmp_path):
    net, names = lan
    nodes = [NsNode(ns, f"{net}.{i + 1}", tmp_path / f"home{i}") for i, ns in enumerate(names)]
    try:
        for n in nodes:
            wait_until(lambda n=n: _answers(n), 30)
        t0 = time.monotonic()
        for n in nodes:  # no --peer anywhere: only mDNS can have told them
            wait_until(lambda n=n: sum(p["trusted"] for p in n.peers().values()) == 2, 15)
        found_s = time.monotonic() - t0
        assert found_s < 15
        leaver = nodes[2]
        old_id = leaver.node_id()
        leaver.kill()
        t0 = time.monotonic()
        wait_until(lambda: not nodes[0].peers()[leaver.cluster_url]["reachable"], 10)
        assert time.monotonic() - t0 < 10
        leaver.start()  # same home: the same node comes back
        wait_until(lambda: _answers(leaver), 30)
        wait_until(lambda: nodes[0].peers()[leaver.cluster_url]["trusted"], 15)
        assert leaver.node_id() == old_id
        assert nodes[0].peers()[leaver.cluster_url]["id"] == old_id
        assert len(nodes[0].peers()) == 2  # no ghost beside the returning node
    finally:
        for n in nodes:
            n.kill()


def _answers(n: NsNode) -> bool:
    try:
        return httpx.get(n.url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
