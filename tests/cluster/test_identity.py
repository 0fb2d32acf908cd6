"""A node's identity survives restarts; two nodes started from one copied state folder are
noticed and exactly one of them takes a new identity."""

from __future__ import annotations

import shutil

from nodes import NodeProcess, free_port
from tests_support import wait_until


def test_restart_keeps_the_identity(tmp_path):
    n = NodeProcess(tmp_path / "home").wait_healthy()
    first = n.client.status().cluster.id
    n.stop()
    n = NodeProcess(tmp_path / "home").wait_healthy()
    try:
        assert n.client.status().cluster.id == first
    finally:
        n.stop()


def test_a_copied_state_folder_is_detected(tmp_path):
    a = NodeProcess(tmp_path / "a").wait_healthy()
    a_id = a.client.status().cluster.id
    a.stop()
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # the user copied the whole folder
    pa, pb = free_port(), free_port()
    a = NodeProcess(tmp_path / "a", "none", "--peer", f"127.0.0.1:{pb}", cluster_port=pa)
    b = NodeProcess(tmp_path / "b", "none", "--peer", f"127.0.0.1:{pa}", cluster_port=pb)
    try:
        a.wait_healthy(), b.wait_healthy()
        def ids() -> tuple[str, str]:
            return a.client.status().cluster.id, b.client.status().cluster.id
        wait_until(lambda: len(set(ids())) == 2, 15)
        assert a_id in ids()  # one kept it, the other changed
        # 3.6 s alone. Under load it once never came: a had learned b's old id before b
        # took a new one and kept signing for the old id, which b refused (unsigned) for
        # good; a peer not proven is now asked its id again on each poll
        wait_until(lambda: all(p["trusted"] for p in a.client._call("GET", "/shoal/peers")), 60)
    finally:
        a.stop()
        b.stop()
