"""Peers typed once: remembered across restarts; a peer that answers garbage is shown as not
in this cluster, one that answers nothing as unreachable, with the reason, never a crash;
the user API needs a key off loopback."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading

from nodes import ROOT, NodeProcess, free_port
from tests_support import wait_until


class Garbage(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"\x00\xffnot json at all")

    def log_message(self, *a: object) -> None:
        pass


def test_peers_are_remembered_and_bad_peers_are_shown_unreachable(tmp_path):
    garbage = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=garbage.serve_forever, daemon=True).start()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # accepts, never answers
    g = f"127.0.0.1:{garbage.server_address[1]}"
    s = f"127.0.0.1:{silent.getsockname()[1]}"
    nothing = f"127.0.0.1:{free_port()}"  # no one there at all
    node = NodeProcess(tmp_path / "home", "none", "--peer", g, "--peer", s,
                       "--peer", nothing).wait_healthy()
    try:
        def peers() -> dict:
            return {p["url"]: p for p in node.client._call("GET", "/shoal/peers")}
        wait_until(lambda: all(p["error"] for p in peers().values()), 15)
        for p in peers().values():
            assert not p["trusted"] and p["error"]
        for a in (s, nothing):
            assert not peers()[f"https://{a}"]["reachable"]
        # the garbage server answers, but not over the cluster's TLS: not a member
        assert "not in this cluster" in peers()[f"https://{g}"]["error"]
        assert "not a Shoal node" in peers()[f"https://{g}"]["error"]
        assert node.client.health().ok  # still serving
    finally:
        node.stop()
    # Restarted without --peer: the addresses typed before are still there.
    again = NodeProcess(tmp_path / "home", "none").wait_healthy()
    try:
        assert set(p["url"] for p in again.client._call("GET", "/shoal/peers")) == \
            {f"https://{a}" for a in (g, s, nothing)}
    finally:
        again.stop()
        garbage.shutdown()
        silent.close()


def test_the_user_api_needs_a_key_off_loopback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "app.cli", "node", "--host", "0.0.0.0",
                        "--port", str(free_port()), "--home", str(tmp_path), "--model", "none"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "--api-key" in r.stderr and "Traceback" not in r.stderr
