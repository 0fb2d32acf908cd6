"""Prefill on one node, decode on another, between two real nodes on loopback for each kind
of KV a model keeps: plain (Llama), MLA's latent (DeepSeek V3), a sliding window (Gemma 3),
recurrent state beside plain layers (Qwen3-Next) and 8-bit quantized KV, each with a
prompt longer than the prefill's 512-token chunk: the answer is token for token the one the
decode node gives alone, and its prompt is reported cached (the KV came from the prefill
node)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import httpx
import pytest

from families import make_family_model
from nodes import start_cluster
from tiny import make_tiny_model

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(sys.platform != "linux", reason="two nodes on loopback")]
KINDS = [("llama", None), ("deepseek_v3", None), ("gemma3_text", None),
         ("qwen3_next", None), ("wide", 8)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("handover-families")
    models = root / "models"
    for name, _ in KINDS:
        if name == "wide":  # head_dim 64: quantized KV's groups are 64 (or 32) wide
            make_tiny_model(models / name, hidden_size=256, num_attention_heads=4,
                            num_key_value_heads=2)
        else:
            make_family_model(models / name, name, seed=3)
    nodes = start_cluster(root / "pair", models / "llama", 2)
    for n in nodes:  # both nodes hold every model
        shutil.copytree(models, n.home / "models", dirs_exist_ok=True)
    yield nodes
    for n in nodes:
        n.stop()


def launch(node, model: str, bits: int | None, **extra) -> None:
    r = httpx.post(node.url + "/shoal/instances", timeout=300, json={
        "model": model, "nodes": [{"node": "self"}], **({"kv_bits": bits} if bits else {}),
        **extra})
    assert r.status_code == 201, r.text


def complete(node, model: str, prompt: str) -> dict:
    r = httpx.post(node.url + "/v1/completions", timeout=300, json={
        "model": model, "prompt": prompt, "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("model,bits", KINDS)
def test_each_kind_of_kv_crosses_and_decodes_as_one_node_does(pair, model: str,
                                                              bits: int | None) -> None:
    decode, prefill = pair
    text = " ".join(f"{model} line {i} of the log, tide {i % 7}." for i in range(40))
    launch(decode, model, bits)
    alone = complete(decode, model, text)
    assert alone["usage"]["prompt_tokens"] > 600  # more than one 512-token chunk
    launch(prefill, model, bits)  # (the launch below starts it there if nothing runs)
    launch(decode, model, bits, prefill=prefill.client.status().cluster.id,
           prefill_min=100)  # a fresh worker: an empty prefix cache
    handed = Path(decode.log).read_text().count("prefilled by")
    split = complete(decode, model, text)
    assert split["choices"][0]["text"] == alone["choices"][0]["text"]
    usage = split["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    assert Path(decode.log).read_text().count("prefilled by") == handed + 1
