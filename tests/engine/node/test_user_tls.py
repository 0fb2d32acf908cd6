"""The user API over TLS (--tls-cert/--tls-key), for clients on other machines: it serves
HTTPS with the user's certificate and nothing in clear; half a pair is refused at start."""

from __future__ import annotations

import ssl
import subprocess
import sys

import httpx
import pytest

from certs import self_signed
from nodes import ROOT, NodeProcess
from tests_support import wait_until


def test_the_user_api_serves_https_with_the_users_certificate(tmp_path):
    cert, key = self_signed(tmp_path, ip="127.0.0.1")
    node = NodeProcess(tmp_path / "home", "none", "--tls-cert", str(cert),
                       "--tls-key", str(key))
    https = node.url.replace("http://", "https://")
    trust = ssl.create_default_context(cafile=str(cert))
    try:
        def up() -> bool:
            assert node.proc.poll() is None, node.tail()
            try:
                return httpx.get(https + "/health", verify=trust, timeout=2).is_success
            except httpx.HTTPError:
                return False
        wait_until(up, 60)
        assert httpx.get(https + "/v1/models", verify=trust, timeout=10).status_code == 200
        with pytest.raises(httpx.HTTPError):  # nothing in clear
            httpx.get(node.url + "/v1/models", timeout=5)
    finally:
        node.stop()


def test_half_a_certificate_pair_is_refused_at_start(tmp_path):
    cert, _ = self_signed(tmp_path)
    r = subprocess.run([sys.executable, "-m", "engine.cli", "node", "--home",
                        str(tmp_path / "home"), "--model", "none", "--port", "0",
                        "--tls-cert", str(cert)], cwd=ROOT, capture_output=True,
                       text=True, timeout=60, env={"SHOAL_KEYRING": "0", "SHOAL_MDNS": "off",
                                                   "PATH": "/usr/bin:/bin"})
    assert r.returncode != 0
    assert "--tls-cert and --tls-key" in r.stderr
