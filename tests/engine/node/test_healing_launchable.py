"""The planner's choice is always launchable, on whichever node it is handed to: a launch
without nodes (healing's, after a node was lost) becomes a body with every rank's layers,
and the node that holds rank 0 resolves that body as the asking node did. A planner that
chose one node other than the asking one used to hand over {"node": "self"} without
layers, which the pipeline check refused ("nodes[0] needs 'layers'"), and the model
stayed down."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from engine.api.common import parse
from engine.errors import BadRequest
from engine.node.launch import (
    LaunchRequest,
    first_choice,
    handed_over,
    planned_request,
    resolve_ranks,
)

GB = 1e9
LLAMA_CONFIG = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                "num_attention_heads": 32, "num_key_value_heads": 8,
                "num_hidden_layers": 32, "vocab_size": 128256,
                "tie_word_embeddings": False, "max_position_embeddings": 131072}


@dataclass
class Peer:
    id: str
    name: str
    url: str
    reachable: bool = True
    trusted: bool = True
    warning: str | None = None


class Peers:
    """What resolve_ranks asks of a node's peers: the others, found by id or name."""

    def __init__(self, me: str, ids: list[str]):
        self._peers = [Peer(i, f"mac-{i}", f"https://{i}:1") for i in ids if i != me]

    def find(self, ref: str) -> Peer | None:
        return next((p for p in self._peers if ref in (p.id, p.name, p.url)), None)

    def all(self) -> list[Peer]:
        return list(self._peers)


def infos(memory_gb: dict[str, float]) -> list[dict]:
    return [{"id": i, "name": f"mac-{i}", "chip": "Apple M2 Max", "gpu_cores": 38,
             "memory_usable_bytes": gb * GB, "models": ["llama"]}
            for i, gb in memory_gb.items()]


@pytest.mark.parametrize("memory_gb,placed", [
    ({"a": 0.5, "b": 64}, ["b"]),  # the asker can't hold a layer: one other node alone
    ({"a": 2, "b": 64}, ["b", "a"]),  # split, rank 0 on the other node
    ({"a": 64, "b": 64}, ["a", "b"]),  # tensor, rank 0 here
    ({"a": 1, "b": 64, "c": 64}, ["b", "c"]),  # tensor over the two others
    ({"a": 10, "b": 10, "c": 4}, ["a", "b", "c"]),  # split three ways
])
def test_the_planners_choice_resolves_on_the_node_it_is_handed_to(memory_gb, placed):
    ids = list(memory_gb)
    inputs = {"node_infos": infos(memory_gb), "links": [], "model_config": LLAMA_CONFIG,
              "weight_bytes": int(16 * GB), "model_context": 8192}
    req = parse(LaunchRequest, {"model": "llama", "kv_bits": 16})
    chosen = first_choice(inputs, req, "a")  # type: ignore[arg-type]
    assert [r.node for r in chosen.ranks] == placed
    req = planned_request(req, chosen)
    ranks = resolve_ranks(req, ("a", "mac-a"), Peers("a", ids))  # type: ignore[arg-type]
    assert [r.layers for r in ranks] == [r.layers for r in chosen.ranks]
    if ranks[0].url is None:
        return
    owner = ranks[0].node
    body = parse(LaunchRequest, handed_over(req, ranks))
    there = resolve_ranks(body, (owner, f"mac-{owner}"), Peers(owner, ids))  # type: ignore[arg-type]
    assert there[0].url is None  # the node handed to holds rank 0 itself
    assert [(r.node, r.layers) for r in there] == [(r.node, r.layers) for r in ranks]


def test_one_node_needs_no_layers_and_a_split_still_does():
    one = parse(LaunchRequest, {"model": "llama", "nodes": [{"node": "self"}]})
    assert resolve_ranks(one, ("a", "mac-a"), Peers("a", ["a"]))[0].layers is None  # type: ignore[arg-type]
    two = parse(LaunchRequest, {"model": "llama", "nodes": [{"node": "self"},
                                                            {"node": "b", "layers": [2, 4]}]})
    with pytest.raises(BadRequest, match=r"nodes\[0\] needs 'layers'"):
        resolve_ranks(two, ("a", "mac-a"), Peers("a", ["a", "b"]))  # type: ignore[arg-type]
