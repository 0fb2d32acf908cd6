"""The settings the app reads and writes through its node: the cluster secret (shown,
rotated: the same store `shoal secret` uses) and the Hugging Face token (checked, stored)."""

from __future__ import annotations

import pytest

from engine.cluster.secret import SecretStore
from engine.errors import ShoalError
from engine.hub.token import TokenStore
from nodes import NodeProcess


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProcess(tmp_path_factory.mktemp("settings-node"), "none")
    try:
        yield n.wait_healthy()
    finally:
        n.stop()


def test_the_secret_is_shown_and_rotated(node, monkeypatch):
    monkeypatch.setenv("SHOAL_KEYRING", "0")  # as the node keeps it
    shown = node.client.cluster_secret()
    assert shown["secret"] == SecretStore(node.home).get()
    assert "readable only by you" in shown["where"] and shown["pairing"]
    rotated = node.client.cluster_secret(rotate=True)
    assert rotated["secret"] != shown["secret"]
    assert SecretStore(node.home).get() == rotated["secret"]


def test_an_empty_token_is_refused_and_nothing_is_stored(node, monkeypatch):
    monkeypatch.setenv("SHOAL_KEYRING", "0")
    with pytest.raises(ShoalError, match="No token given") as refused:
        node.client.set_hf_token("  ")
    assert refused.value.status == 400 and refused.value.param == "token"  # the client's
    assert TokenStore(node.home).get() is None
