"""A launch body is checked once, by LaunchRequest (engine/node/launch.py): each bad field is
a 400 naming it, before any node is asked for anything; the worker's DistConfig is built
directly and survives the trip to a follower's file."""

from __future__ import annotations

import pytest

from engine.api.common import parse
from engine.cluster.dist_config import DistConfig
from engine.errors import BadRequest
from engine.node.launch import LaunchRequest, NodeRef


@pytest.mark.parametrize("body,param,words", [
    ({}, "model", "required"),
    ({"model": 3}, "model", "valid string"),
    ({"model": "m", "strategy": "sideways"}, "strategy", "'pipeline' or 'tensor'"),
    ({"model": "m", "backend": "carrier-pigeon"}, "backend", "'ring'"),
    ({"model": "m", "nodes": [{"node": "a"}, {"layers": [0, 2]}]}, "nodes[1].node",
     "required"),
    ({"model": "m", "nodes": [{"node": "a", "layers": [0, 2, 4]}]}, "nodes[0].layers",
     "at most 2"),
    ({"model": "m", "nodes": [{"node": "a", "layers": ["0", 2]}]}, "nodes[0].layers[0]",
     "integer"),
    ({"model": "m", "nodes": [{"node": "a", "rank": 1}]}, "nodes[0].rank", "remove it"),
    ({"model": "m", "context": 0}, "context", "greater than or equal to 1"),
    ({"model": "m", "force": "yes"}, "force", "boolean"),
    ({"model": "m", "lanes": 1.5}, "lanes", "whole number, not 1.5"),
    ({"model": "m", "gpus": 4}, "gpus", "not a parameter Shoal understands"),
])
def test_a_bad_launch_names_its_field(body, param, words):
    with pytest.raises(BadRequest) as e:
        parse(LaunchRequest, body)
    assert e.value.param == param and words in e.value.message, e.value.message


def test_a_launch_handed_over_keeps_what_was_asked():
    req = parse(LaunchRequest, {"model": "m", "context": 8192, "force": True,
                                "nodes": [{"node": "a", "layers": [0, 2]}]})
    assert req.body([NodeRef(node="self")]) == {
        "model": "m", "strategy": "pipeline", "backend": "ring", "context": 8192,
        "force": True, "nodes": [{"node": "self"}]}


def test_dist_config_round_trips_through_its_file_form():
    cfg = DistConfig(rank=1, world=2, backend="jaccl", hosts=("10.0.0.1:1", "10.0.0.2:2"),
                     bells=("10.0.0.1:3", "10.0.0.2:4"), strategy="pipeline",
                     layers=((0, 3), (3, 6)), timeout_s=120,
                     devices=((None, "rdma_en3"), ("rdma_en3", None)),
                     coordinator="10.0.0.1:1", prefix_cache_tokens=4096, lanes=2)
    assert DistConfig.from_json(cfg.to_json()) == cfg


def test_a_failure_on_a_node_names_it_for_the_app():
    """The launch panel marks the node a failure is on from the error's "node", not by
    reading its message; the field survives the trip through engine.client."""
    from engine.errors import ShoalError, WorkerFailed
    from engine.node.group_start import blame
    from engine.node.launch import Rank

    err = blame(Rank("3f9a2c81d4e0", "http://10.0.0.2:8421"), WorkerFailed("out of memory"))
    body = err.to_openai()
    assert body["error"]["node"] == "3f9a2c81d4e0"
    assert body["error"]["message"] == "node 3f9a2c81d4e0: out of memory"
    back = ShoalError.from_openai(body, 502)
    assert back.node == "3f9a2c81d4e0" and back.message == err.message
    assert "node" not in ShoalError("plain").to_openai()["error"]


def test_an_embedding_model_is_not_split_over_nodes():
    from engine.node.launch import Rank, check_placement
    bert = {"model_type": "bert", "architectures": ["BertModel"], "num_hidden_layers": 6,
            "num_attention_heads": 12, "hidden_size": 384}
    ranks = [Rank("a", None), Rank("b", "http://10.0.0.2:8421")]
    for strategy in ("pipeline", "tensor"):
        with pytest.raises(BadRequest, match="embedding or reranker model") as e:
            check_placement(bert, strategy, ranks)
        assert e.value.param == "model"
