"""Every family Shoal must split, launched as a user launches it (POST /shoal/instances on
real node processes over MLX's ring on loopback) as a pipeline and, where mlx-lm can split
it, tensor parallel: greedy output through the API must be token for token what mlx-lm
gives in one process on the same weights. A combination that can't run is refused before
any worker starts, with the family, the strategy and why."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import httpx
import pytest

from engine.placement.families import strategy_refusal
from families import FAMILIES, make_family_model
from nodes import NodeProcess, start_cluster

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="ring over loopback, Linux CI")

HELLO = [{"role": "user", "content": "Split me across nodes"}]
TOKENS = 8
# (family, strategy) pairs to run; the rest of the table is refused by the rule.
RUNS = [(f, s) for f in FAMILIES for s in ("pipeline", "tensor")
        if strategy_refusal(FAMILIES[f]["model_type"], s) is None]
REFUSED = [(f, s) for f in FAMILIES for s in ("pipeline", "tensor") if (f, s) not in RUNS]


@pytest.fixture(scope="module")
def family_models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("family-models")
    for name in FAMILIES:
        make_family_model(root / name, name, seed=3)
    return root


@pytest.fixture(scope="module")
def reference(family_models) -> dict[str, str]:
    """What mlx-lm itself says, greedy, in this process."""
    from mlx_lm import load, stream_generate
    from mlx_lm.sample_utils import make_sampler

    out = {}
    for name in FAMILIES:
        model, tok = load(str(family_models / name))
        prompt = tok.apply_chat_template(HELLO, add_generation_prompt=True)
        out[name] = "".join(r.text for r in stream_generate(
            model, tok, prompt, max_tokens=TOKENS, sampler=make_sampler(temp=0.0)))
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory, family_models):
    nodes = start_cluster(tmp_path_factory.mktemp("pair"), family_models / "llama", 2)
    for n in nodes:  # every node holds every family
        shutil.copytree(family_models, n.home / "models", dirs_exist_ok=True)
    yield nodes
    for n in nodes:
        n.stop()


def node_id(n: NodeProcess) -> str:
    return n.client.status().cluster.id


def launch(via: NodeProcess, body: dict) -> httpx.Response:
    return httpx.post(via.url + "/shoal/instances", json=body, timeout=300)


@pytest.mark.parametrize("family,strategy", RUNS)
def test_family_runs_split_exactly_like_one_process(pair, reference, family, strategy):
    a, b = pair
    nodes = [{"node": "self"}, {"node": node_id(b)}]
    if strategy == "pipeline":  # uneven: rank 0 one layer, rank 1 three (MoE on both)
        nodes[0]["layers"], nodes[1]["layers"] = [0, 1], [1, 4]
    r = launch(a, {"model": family, "strategy": strategy, "nodes": nodes})
    assert r.status_code == 201, r.text
    # mlx-lm's text shows special tokens as they are; Shoal hides them unless asked
    got = a.client.complete(HELLO, model=family, max_tokens=TOKENS, temperature=0,
                            skip_special_tokens=False, spaces_between_special_tokens=False)
    assert got["choices"][0]["message"]["content"] == reference[family]
    ranks = r.json()["ranks"]  # each rank says what it read and its peak memory
    assert all(x["loaded"]["bytes_read"] > 0 and x["loaded"]["peak_rss"] > 0 for x in ranks)


@pytest.mark.parametrize("family,strategy", REFUSED)
def test_a_combination_that_cant_run_is_refused_before_anything_starts(pair, family,
                                                                       strategy):
    a, b = pair
    before = a.client._call("GET", "/shoal/instances")
    r = launch(a, {"model": family, "strategy": strategy,
                   "nodes": [{"node": "self"}, {"node": node_id(b)}]})
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert FAMILIES[family]["model_type"] in msg and strategy in msg, msg
    assert a.client._call("GET", "/shoal/instances") == before  # nothing started or stopped
    plan = httpx.post(a.url + "/shoal/plan", json={"model": family}, timeout=60).json()
    assert not [p for p in plan["placements"] if p["strategy"] == strategy]
    assert FAMILIES[family]["model_type"] in plan["strategies"][strategy]  # the GUI greys it
    why = [x["reason"] for x in plan["rejected"] if x["strategy"] == strategy]
    assert why and all(FAMILIES[family]["model_type"] in w for w in why)


def test_three_nodes_deepseek_style_moe(tmp_path, family_models, reference):
    nodes = start_cluster(tmp_path, family_models / "kimi_k2", 3)
    try:
        a, b, c = nodes
        r = launch(a, {"model": "kimi_k2", "strategy": "pipeline",
                       "nodes": [{"node": "self", "layers": [0, 2]},
                                 {"node": node_id(b), "layers": [2, 3]},
                                 {"node": node_id(c), "layers": [3, 4]}]})
        assert r.status_code == 201, r.text
        got = c.client.complete(HELLO, model="kimi_k2", max_tokens=TOKENS, temperature=0)
        assert got["choices"][0]["message"]["content"] == reference["kimi_k2"]
    finally:
        for n in nodes:
            n.stop()
