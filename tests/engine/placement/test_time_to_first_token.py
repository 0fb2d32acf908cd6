"""The time to first token the planner predicts: per prompt length, with the prefix cache's
share, a pipeline's overlapping chunks against stage after stage, the chunk sizes the node
really uses, and placements ranked for agents by it."""

from __future__ import annotations

import pytest
from placement_support import dense, mesh, node

from engine.placement.cost import Stage, predict, touched, ttft_s
from engine.placement.model import ModelSpec
from engine.placement.planner import plan
from engine.placement.tables import Assumptions

MODEL = dense()  # Llama-3.3-70B's shape at 4-bit


def stages(n: int) -> list[Stage]:
    cut = [MODEL.layers * i // n for i in range(n + 1)]
    return [Stage(node(f"n{i}", 96), (cut[i], cut[i + 1]), i == 0) for i in range(n)]


def test_every_prompt_length_that_fits_the_context_is_predicted_and_longer_ones_wait_longer():
    p = predict(MODEL, "pipeline", stages(1), [], 32768)
    assert [n for n, *_ in p.ttft] == [1000, 10000]  # 50K is longer than the context
    (_, c1, alone1, busy1), (_, _, alone10, busy10) = p.ttft
    assert c1 == 0 and 0 < alone1 < alone10 and alone1 <= busy1 and alone10 <= busy10
    # attention over a longer prompt: 10x the tokens take more than 10x the time
    assert alone10 > 10 * (alone1 - 1 / p.decode_tps)
    assert p.ttft_at() == alone10 and p.ttft_at(1000) == alone1
    assert p.ttft_at(50000) == float("inf")


def test_what_the_prefix_cache_holds_is_not_prefilled_again():
    cold = predict(MODEL, "pipeline", stages(1), [], 32768)
    warm = predict(MODEL, "pipeline", stages(1), [], 32768, Assumptions(prompt_cached=0.9))
    assert [c for _, c, *_ in warm.ttft] == [900, 9000]
    for (_, _, a, _), (_, _, b, _) in zip(cold.ttft, warm.ttft):
        # a tenth of the tokens to prefill, each attending to the whole prompt
        assert 0.1 * a < b < 0.3 * a


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_a_pipelines_chunks_overlap_where_they_flow_and_not_in_lockstep(ranks):
    one = ttft_s(MODEL, "pipeline", stages(1), [], 10000)
    ring = mesh([s.node for s in stages(ranks)]) * 2
    flowing = ttft_s(MODEL, "pipeline", stages(ranks), ring, 10000, overlap=True)
    lockstep = ttft_s(MODEL, "pipeline", stages(ranks), ring, 10000, overlap=False)
    # stage after stage is one node's time plus the hops; overlapped, nearly 1/ranks of it
    assert one < lockstep < 1.1 * one
    assert one / ranks < flowing < 1.25 * one / ranks
    # and what a group serving several streams predicts is the overlapped one
    got = predict(MODEL, "pipeline", stages(ranks), ring, 32768).ttft_at(10000)
    assert got == pytest.approx(flowing)
    serial = predict(MODEL, "pipeline", stages(ranks), ring, 32768, Assumptions(streams=1))
    assert serial.ttft_at(10000) == pytest.approx(lockstep)


def test_a_small_chunk_reads_most_experts_so_prefill_alone_takes_large_ones():
    kimi = ModelSpec(name="kimi", layers=61, hidden=7168, heads=64, kv_heads=64,
                     head_dim=128, intermediate=18432, vocab=163840, bytes_per_param=0.56,
                     experts=384, active_experts=8, moe_intermediate=2048, dense_layers=1)
    assert touched(kimi, 1) == 0 and touched(dense(), 512) == 0
    assert touched(kimi, 16) == pytest.approx(0.27, abs=0.01)
    assert touched(kimi, 2048) > 0.99
    mac = [Stage(node("studio", 600), (0, 61), True)]
    alone = ttft_s(kimi, "pipeline", mac, [], 10000)  # ~1 s chunks
    small = ttft_s(kimi, "pipeline", mac, [], 10000,
                   a=Assumptions(chunk_alone_s=0.1))  # chunks of a few dozen tokens
    assert small > 1.5 * alone


def test_placements_rank_for_agents_by_the_longest_prompts_first_token():
    nodes = [node("a", 96), node("b", 96), node("c", 96), node("fast", 192, 1600)]
    links = mesh(nodes)
    chat = plan(MODEL, nodes, links, 65536, rank="chat")
    agents = plan(MODEL, nodes, links, 65536, rank="agents")
    waits = [float(f"{p.prediction.ttft_at(50000):.3g}") for p in agents]
    assert waits == sorted(waits)
    assert chat[0].decode_tps == max(p.decode_tps for p in chat)
    # the fastest single node decodes best; a pipeline over the others answers sooner
    assert [r.name for r in chat[0].ranks] == ["fast"]
    assert len(agents[0].ranks) > 1
    assert agents[0].prediction.ttft_at(50000) < chat[0].prediction.ttft_at(50000)
    assert plan(MODEL, nodes, links, 65536, rank="decode")[0] == chat[0]


def test_energy_is_predicted_from_each_nodes_watts_and_only_where_all_are_known():
    from dataclasses import replace

    one = [replace(s, node=replace(s.node, watts=295.0)) for s in stages(1)]
    p = predict(MODEL, "pipeline", one, [], 32768)
    assert p.watts == 295.0 and p.decode_j_per_token == pytest.approx(295.0 / p.decode_tps)
    two = [replace(s, node=replace(s.node, watts=295.0)) for s in stages(2)]
    ring = mesh([s.node for s in two]) * 2
    q = predict(MODEL, "pipeline", two, ring, 32768)
    # both Macs draw power for each token, and a pipeline decodes no faster than one
    assert q.watts == 590.0 and q.decode_j_per_token > 1.9 * p.decode_j_per_token
    unknown = [two[0], replace(two[1], node=replace(two[1].node, watts=0.0))]
    assert predict(MODEL, "pipeline", unknown, ring, 32768).decode_j_per_token == 0.0


def test_the_plan_names_joules_for_macs_apple_publishes_the_power_of(tmp_path, capsys):
    import json

    from engine.cli import main

    sim = tmp_path / "sim.json"
    sim.write_text(json.dumps({
        "nodes": [{"name": "u1", "profile": "mac-studio-m2-ultra", "memory_gb": 192},
                  {"name": "m4", "profile": "mac-studio-m4-max", "memory_gb": 128}],
        "links": [{"mesh": "thunderbolt5", "nodes": ["u1", "m4"]}]}))
    assert main(["plan", "Llama-3.3-70B", "--quant", "4bit", "--simulate", str(sim),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by_nodes = {tuple(r["name"] for r in p["ranks"]): p for p in doc["placements"]}
    ultra = by_nodes[("u1",)]
    assert ultra["watts"] == 295  # Apple's maximum for the M2 Ultra Mac Studio
    assert ultra["decode_j_per_token"] == pytest.approx(295 / ultra["decode_tps"])
    assert ultra["ttft"][0]["joules"] == pytest.approx(295 * ultra["ttft"][0]["seconds"])
    # Apple publishes no power figure for the M4 Max Mac Studio: no joules, not a guess
    assert by_nodes[("m4",)]["decode_j_per_token"] is None


def test_a_nodes_watts_measured_while_it_generated_replace_the_catalogues():
    from placement_support import LLAMA_CONFIG

    from engine.node.planning import plan_from_cluster, planner_node
    from engine.records import NodeInfo

    def studio(nid: str, chip: str, serving: float | None) -> NodeInfo:
        power = {"watts": 9.0, "source": "ioreport"}  # idle now: not what the plan uses
        if serving is not None:
            power["serving_watts"] = serving
        return NodeInfo.from_json({"id": nid, "name": nid, "machine": {"chip": chip, "memory": {
            "available_bytes": 180e9, "total_bytes": 192e9}}, "power": power,
            "models": ["llama"]})

    def watts(info: NodeInfo) -> float:
        report = plan_from_cluster([planner_node(info)], LLAMA_CONFIG, 8192, [],
                                   model_name="llama")
        return report.placements[0].prediction.watts

    assert watts(studio("u", "Apple M2 Ultra", None)) == 295.0  # Apple's maximum
    assert watts(studio("u", "Apple M2 Ultra", 121.5)) == 121.5  # what it drew serving
    assert watts(studio("m", "Apple M4 Max", None)) == 0.0  # unknown: no guess
    assert watts(studio("m", "Apple M4 Max", 64.0)) == 64.0


def test_a_nodes_measured_decoder_layer_rate_paces_its_prefill_by_the_models_width():
    from dataclasses import replace

    from engine.node.planning import _widths
    from engine.placement.cost import prefill_rate

    # this 2-core CPU, one core: a 512-wide layer's matmuls at 60 GFLOP/s, 2048-wide at 97,
    # where a 1024-cubed matmul gets 148
    cpu = replace(node("cpu", 16), compute_flops=148e9 / 0.5, attention_flops=15e9,
                  prefill_flops=_widths({"2048": 97e9, "512": 60e9}))
    assert cpu.prefill_flops == ((512, 60e9), (2048, 97e9))
    assert prefill_rate(cpu, 256) == 60e9 and prefill_rate(cpu, 8192) == 97e9  # held
    assert prefill_rate(cpu, 1024) == pytest.approx((60e9 + 97e9) / 2)  # log-midway
    assert prefill_rate(replace(cpu, prefill_flops=()), 1024) == 0.0  # unmeasured
    for bad in (None, [], {"wide": 1.0}, {"512": "fast"}, {"512": -1.0}):
        assert _widths(bad) == ()
    wide = dense()
    one = [Stage(cpu, (0, wide.layers), True)]
    unmeasured = [Stage(replace(cpu, prefill_flops=()), (0, wide.layers), True)]
    # a chunk's matmuls at the layer's measured rate, not the big matmul's
    assert ttft_s(wide, "single", one, [], 2000) > 1.4 * ttft_s(wide, "single", unmeasured,
                                                                [], 2000)
    # decode is memory-bound: the same either way
    assert predict(wide, "single", one, [], 8192).decode_tps == pytest.approx(
        predict(wide, "single", unmeasured, [], 8192).decode_tps)


def test_a_chunk_attends_to_itself_so_a_prompt_from_nothing_pays_for_its_own_attention():
    from dataclasses import replace

    from engine.placement.cost import pipeline_step_s

    slow = replace(node("cpu", 96), attention_flops=1e9)  # attention far behind matmuls
    fast = replace(slow, attention_flops=1e15)
    st = [Stage(slow, (0, MODEL.layers), True)]
    quick = [Stage(fast, (0, MODEL.layers), True)]
    # nothing cached: all that attention costs is the chunk's own, causal, half of it
    own = pipeline_step_s(MODEL, st, [], 2048, 0) - pipeline_step_s(MODEL, quick, [], 2048, 0)
    scores = MODEL.layers * 2049 / 2
    want = 2 * 2048 * MODEL.heads * MODEL.score_per_head * scores / 1e9
    assert own == pytest.approx(want, rel=0.01)
    # one token decoding attends to what is cached only
    assert pipeline_step_s(MODEL, st, [], 1, 0) == pytest.approx(
        pipeline_step_s(MODEL, quick, [], 1, 0))


def test_a_cpu_node_reads_the_float32_weights_it_unpacks_where_they_fit():
    from dataclasses import replace

    four_bit = replace(dense(), bytes_per_param=0.5625)  # 70B: 280 GB in float32
    mac = node("mac", 192)
    cpu = replace(mac, unpacks=True)
    roomy = replace(cpu, memory_bytes=1024 * 10**9)  # float32 fits in half its memory

    def decode(nd):
        return predict(four_bit, "single", [Stage(nd, (0, four_bit.layers), True)], [],
                       8192).decode_tps
    # a Mac runs the 4-bit weights; a CPU node too where float32 doesn't fit in half its
    # memory (engine/platform/cpu.py keeps them packed); where it fits, it reads 4 bytes
    assert decode(cpu) == pytest.approx(decode(mac))
    assert decode(roomy) < 0.2 * decode(replace(roomy, unpacks=False))
