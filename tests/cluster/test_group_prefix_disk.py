"""The prefix cache's disk tier for a group of real nodes: each node started with
--prefix-disk-gb, a pipeline group over two of them. A long prompt's KV is kept on both
nodes' disks (each rank its own layers), and after the group is launched again the same
prompt is found there (cached tokens reported) and answered the same. Before, a rank run
for another node's group got none of its node's worker flags, so only rank 0 kept its
share and nothing was ever restored."""

from __future__ import annotations

import json

import httpx
import pytest

from nodes import start_cluster

pytestmark = pytest.mark.slow
LONG = "The quick brown fox jumps over the lazy dog. " * 12


def test_a_group_finds_a_long_prompt_on_its_nodes_disks_after_a_relaunch(tmp_path,
                                                                         tiny_model_dir):
    a, b = nodes = start_cluster(tmp_path, tiny_model_dir, 2,
                                 extra=("--prefix-disk-gb", "1"))
    try:
        layers = json.loads((tiny_model_dir / "config.json").read_text())["num_hidden_layers"]
        body = {"model": "tiny-llama", "strategy": "pipeline", "nodes": [
            {"node": "self", "layers": [0, layers // 2]},
            {"node": b.client.status().cluster.id, "layers": [layers // 2, layers]}]}

        def ask() -> tuple[str, int]:
            r = httpx.post(a.url + "/v1/completions", timeout=120, json={
                "model": "tiny-llama", "prompt": LONG, "max_tokens": 8, "temperature": 0})
            assert r.status_code == 200, r.text
            got = r.json()
            return got["choices"][0]["text"], \
                got["usage"]["prompt_tokens_details"]["cached_tokens"]

        assert httpx.post(a.url + "/shoal/instances", timeout=300, json=body).status_code == 201
        text, cached = ask()
        assert cached == 0
        assert httpx.post(a.url + "/shoal/instances", timeout=300, json=body).status_code == 201
        for n in nodes:  # each rank kept its own layers' share
            assert list((n.home / "cache" / "prefix").glob("*/*.safetensors")), n.home
        again, cached = ask()
        assert again == text and cached > 256
    finally:
        for n in nodes:
            n.stop()
