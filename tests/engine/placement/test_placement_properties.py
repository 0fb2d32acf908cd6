"""Property tests of the planner: every placement it proposes covers each layer exactly once
in contiguous ranges, gives every node work, never exceeds a node's memory unless forced,
and its predictions move the right way when hardware gets faster or links slower."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from placement_support import mesh, node

from engine.placement.memory import Sizer
from engine.placement.model import ModelSpec
from engine.placement.planner import evaluate, plan
from engine.placement.split import split_pipeline
from engine.placement.validate import NotEnoughMemory, even_split

FAST = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


@st.composite
def models(draw: st.DrawFn, max_layers: int = 96) -> ModelSpec:
    heads = draw(st.sampled_from([8, 16, 32, 64]))
    kv = draw(st.sampled_from([d for d in (1, 2, 4, 8, heads) if heads % d == 0]))
    experts = draw(st.sampled_from([0, 0, 8, 64]))
    moe = {}
    if experts:
        moe = dict(experts=experts, active_experts=draw(st.integers(1, min(8, experts))),
                   moe_intermediate=draw(st.sampled_from([256, 1024, 2048])),
                   dense_layers=draw(st.integers(0, 2)))
    return ModelSpec(name="m", layers=draw(st.integers(1, max_layers)),
                     hidden=draw(st.sampled_from([1024, 4096, 8192])), heads=heads,
                     kv_heads=kv, head_dim=128,
                     intermediate=draw(st.sampled_from([4096, 14336, 28672])),
                     vocab=draw(st.sampled_from([32000, 151936])),
                     bytes_per_param=draw(st.sampled_from([0.5625, 1.0625, 2.0])),
                     tie_embeddings=draw(st.booleans()), **moe)


@st.composite
def clusters(draw: st.DrawFn, max_nodes: int = 5):
    n = draw(st.integers(1, max_nodes))
    nodes = [node(f"n{i}", draw(st.floats(2, 400)), draw(st.floats(50, 1000)),
                  draw(st.floats(2, 30)), draw(st.booleans()), draw(st.booleans()))
             for i in range(n)]
    links = mesh(nodes, draw(st.floats(5, 3000)), draw(st.floats(1, 80)),
                 draw(st.sampled_from([None, 10.0])))
    return nodes, links


def _check_shape(p, model: ModelSpec) -> None:
    ids = [r.node for r in p.ranks]
    assert len(set(ids)) == len(ids)
    if p.strategy == "tensor":
        assert all(r.layers == (0, model.layers) for r in p.ranks)
        assert model.heads % len(ids) == 0 and model.kv_heads % len(ids) == 0
    else:
        assert p.ranks[0].layers[0] == 0 and p.ranks[-1].layers[1] == model.layers
        for a, b in zip(p.ranks, p.ranks[1:]):
            assert a.layers[1] == b.layers[0]  # contiguous: no gap, no overlap
        assert all(r.layers[1] - r.layers[0] >= 1 for r in p.ranks)
    pr = p.prediction
    for v in (pr.decode_tps, pr.decode_tps_full, pr.prefill_tps):
        assert v > 0 and math.isfinite(v)
    assert pr.decode_tps_full <= pr.decode_tps * (1 + 1e-9)


@FAST
@given(models(), clusters(), st.sampled_from([512, 4096, 32768, 131072]))
def test_every_planned_placement_covers_each_layer_once_and_fits(model, cluster, context):
    nodes, links = cluster
    found = plan(model, nodes, links, context)
    for p in found:
        _check_shape(p, model)
        assert p.fits and not p.warnings
        assert all(r.memory.total <= r.memory.usable for r in p.ranks)
        if p.backend == "jaccl":
            assert all(nd.rdma for nd in nodes if nd.id in {r.node for r in p.ranks})
    keys = [float(f"{p.decode_tps:.3g}") for p in found]
    assert keys == sorted(keys, reverse=True)  # fastest decode first


@FAST
@given(models(), clusters(), st.sampled_from([4096, 131072]))
def test_forced_placements_say_which_node_overflows(model, cluster, context):
    nodes, links = cluster
    for p in plan(model, nodes, links, context, force=True):
        _check_shape(p, model)
        over = [r for r in p.ranks if not r.memory.fits]
        assert len(p.warnings) == len(over)
        for r, w in zip(over, p.warnings):
            assert f"node {r.name} needs" in w and "usable" in w


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 9), st.lists(st.floats(0.3, 12), min_size=1, max_size=3),
       st.lists(st.floats(100, 1000), min_size=3, max_size=3))
def test_the_split_fits_whenever_any_contiguous_split_fits(layers, usable, speeds):
    """Exact against brute force: every way to cut the layers among these nodes."""
    assume(len(usable) <= layers)
    model = ModelSpec(name="m", layers=layers, hidden=4096, heads=32, kv_heads=8,
                      head_dim=128, intermediate=14336, vocab=32000, bytes_per_param=2.0)
    nodes = [node(f"n{i}", u, speeds[i]) for i, u in enumerate(usable)]
    size, n = Sizer(model, 8192), len(nodes)

    def fits(ranges):
        return all(size.pipeline(nd, r, i == 0, i == n - 1).fits
                   for i, (nd, r) in enumerate(zip(nodes, ranges)))

    cuts = itertools.combinations(range(1, layers), n - 1)
    possible = any(fits(list(zip((0, *c), (*c, layers)))) for c in cuts)
    try:
        ranges = split_pipeline(model, nodes, 8192)
    except NotEnoughMemory:
        assert not possible
    else:
        assert possible and fits(ranges)


@FAST
@given(models(max_layers=64), clusters(max_nodes=4), st.floats(1.01, 10),
       st.sampled_from(["pipeline", "tensor"]), st.data())
def test_predictions_are_monotone_in_bandwidth_and_latency(model, cluster, k, strategy, data):
    nodes, links = cluster
    n = len(nodes)
    assume(n <= model.layers)
    if strategy == "tensor":
        assume(model.heads % n == 0 and model.kv_heads % n == 0)
        assume(not model.experts or model.moe_intermediate % n == 0)
        assume(model.intermediate % n == 0)
        layout = [nd.id for nd in nodes]
    else:
        layout = [{"node": nd.id, "layers": r}
                  for nd, r in zip(nodes, even_split(model.layers, n))]

    def decode(ns, ls):
        p = evaluate(model, ns, ls, 8192, strategy, layout, force=True)
        return p.prediction

    base = decode(nodes, links)
    i = data.draw(st.integers(0, n - 1))
    faster = [replace(nd, memory_bandwidth_Bps=nd.memory_bandwidth_Bps * k) if j == i else nd
              for j, nd in enumerate(nodes)]
    up = decode(faster, links)
    assert up.decode_tps >= base.decode_tps and up.prefill_tps >= base.prefill_tps
    slow = decode(nodes, [replace(x, latency_s=x.latency_s * k) for x in links])
    assert slow.decode_tps <= base.decode_tps and slow.prefill_tps <= base.prefill_tps
    wide = decode(nodes, [replace(x, bandwidth_Bps=x.bandwidth_Bps * k) for x in links])
    assert wide.decode_tps >= base.decode_tps and wide.prefill_tps >= base.prefill_tps
    if n > 1:  # latency is paid at least once per token
        assert slow.decode_tps < base.decode_tps
