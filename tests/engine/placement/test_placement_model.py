"""Model shapes from config.json files and the shipped profiles: parameter counts that
match the model cards, weight formats, and the KV cache of each attention kind."""

from __future__ import annotations

import pytest
from placement_support import LLAMA_CONFIG

from engine import placement_profiles
from engine.placement.model import ModelSpec, quantized_bytes_per_param
from engine.placement.profiles import profile_model
from engine.placement.tables import kv_tokens
from engine.placement.validate import PlacementError

PROFILES = placement_profiles.models()["models"]


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_profiles_derive_the_parameter_counts_their_model_cards_state(name):
    prof = PROFILES[name]
    assert prof["source"].startswith("https://huggingface.co/") and prof["card"]["source"]
    m = profile_model(prof, name, prof["default_quant"])
    assert m.total_params == pytest.approx(prof["card"]["total_params"], rel=0.03)
    if "active_params" in prof["card"]:  # cards count the embedding table too
        assert m.active_params == pytest.approx(prof["card"]["active_params"], rel=0.10)
    layers = sum(m.layer_params(i) for i in range(m.layers))
    assert layers + m.edge_params == pytest.approx(m.total_params)


def test_every_machine_figure_names_its_source():
    doc = placement_profiles.machines()
    for name, m in doc["machines"].items():
        assert m["memory_gb"] and m["memory_bandwidth_gbs"] > 0 and m["fp16_tflops"] > 0
        assert all(m["sources"].values()), name
    assert doc["machines"]["mac-studio-m3-ultra"]["memory_bandwidth_gbs"] == 819
    assert 512 in doc["machines"]["mac-studio-m3-ultra"]["memory_gb"]
    assert all(link["source"] for link in doc["links"].values())
    assert doc["links"]["thunderbolt5"]["bandwidth_gbit"] == 80


@pytest.mark.parametrize("quant, dtype, expected", [
    ({"bits": 4, "group_size": 64}, "bfloat16", 0.5 + 4 / 64),
    ({"bits": 8, "group_size": 32}, "bfloat16", 1 + 4 / 32),
    ({"bits": 4, "group_size": 32, "mode": "mxfp4"}, "bfloat16", 0.5 + 1 / 32),
    # FP8 blocks: mlx-lm unpacks them to bfloat16 as it loads them (DeepSeek, MiniMax)
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "bfloat16", 2.0),
    ({"quant_method": "fp8", "weight_block_size": [32, 32], "scale_fmt": "ue8m0"},
     "bfloat16", 1 + 1 / 32),  # ...unless the scales make them MLX's mxfp8
    (None, "bfloat16", 2.0),
    (None, "float32", 4.0),
])
def test_bytes_per_parameter_include_the_quantization_scales(quant, dtype, expected):
    assert quantized_bytes_per_param(quant, dtype) == pytest.approx(expected)


def test_a_quantized_config_sets_the_weight_size():
    m = ModelSpec.from_config({**LLAMA_CONFIG, "quantization": {"bits": 4, "group_size": 64}})
    assert m.bytes_per_param == pytest.approx(0.5625)
    assert m.total_params * m.bytes_per_param / 1e9 == pytest.approx(39.7, abs=0.1)
    with pytest.raises(PlacementError, match="bits and group_size must be positive"):
        quantized_bytes_per_param({"bits": "four", "group_size": 64})


def test_latent_attention_caches_the_latent_once_for_all_heads():
    ds = profile_model(PROFILES["DeepSeek-V3.1"], "DeepSeek-V3.1", "4bit")
    assert ds.kv_per_token == 512 + 64 and not ds.kv_sharded
    assert ds.dense_layers == 3 and ds.is_moe(3) and not ds.is_moe(2)
    kimi = profile_model(PROFILES["Kimi-K2"], "Kimi-K2", "4bit")
    assert kimi.shardable  # mlx-lm runs kimi_k2 as deepseek_v3, which has shard()


def test_sliding_window_layers_cache_only_their_window():
    oss = profile_model(PROFILES["gpt-oss-120b"], "gpt-oss-120b", "mxfp4")
    cached = kv_tokens(oss, 131072)[-1]
    assert cached == 18 * 131072 + 18 * 128


def test_a_model_by_numbers_spreads_its_stated_parameters_over_its_layers():
    m = ModelSpec(name="x", layers=61, hidden=7168, heads=128, kv_heads=128, head_dim=128,
                  intermediate=0, vocab=129280, experts=256, active_experts=8,
                  bytes_per_param=0.5625, total_params=671_000_000_000,
                  active_params=37_000_000_000)
    assert sum(m.layer_params(i) for i in range(61)) + m.edge_params == pytest.approx(671e9)
    assert sum(m.layer_active_params(i) for i in range(61)) + m.head_params == \
        pytest.approx(37e9)


@pytest.mark.parametrize("config, reason", [
    ({"num_attention_heads": 8, "num_hidden_layers": 2, "vocab_size": 10},
     "config.json has no hidden_size"),
    ({**LLAMA_CONFIG, "num_hidden_layers": 0}, "layers must be a positive whole number"),
])
def test_configs_missing_a_field_are_refused_by_name(config, reason):
    with pytest.raises(PlacementError, match=reason):
        ModelSpec.from_config(config)


def test_drafts_are_predicted_on_one_node_where_they_pay_and_never_below_plain():
    from placement_support import dense, mesh, node

    from engine.placement.cost import Stage, predict
    from engine.placement.tables import Assumptions

    model = dense()
    mac = node("studio", 192)  # memory-bound decode: a pass of 7 tokens costs about one
    p = predict(model, "pipeline", [Stage(mac, (0, 80), True)], [], 8192)
    assert p.decode_tps_drafted > 1.5 * p.decode_tps and p.draft_tokens > 0
    slow = node("cpu", 192, bandwidth_gbs=800, tflops=0.05)  # compute-bound: it can't pay
    q = predict(model, "pipeline", [Stage(slow, (0, 80), True)], [], 8192)
    assert q.decode_tps_drafted == q.decode_tps and q.draft_tokens == 0
    never = predict(model, "pipeline", [Stage(mac, (0, 80), True)], [], 8192,
                    Assumptions(draft_acceptance=0.0))
    assert never.draft_tokens == 0
    a, b = node("a", 96), node("b", 96)  # a pipeline: each pass pays every hop once
    two = predict(model, "pipeline", [Stage(a, (0, 40), True), Stage(b, (40, 80), False)],
                  mesh([a, b]) * 2, 8192)  # a to b, and back
    assert two.decode_tps_drafted > 1.5 * two.decode_tps


def test_a_draft_models_steps_cost_time_and_placements_rank_by_drafts_when_asked():
    from dataclasses import replace

    from placement_support import dense, mesh, node

    from engine.placement.cost import Stage, predict
    from engine.placement.planner import plan

    model = dense()
    mac = node("studio", 192)
    lookup = predict(model, "pipeline", [Stage(mac, (0, 80), True)], [], 8192)
    drafting = replace(mac, draft_bytes=int(4e9))  # a 4 GB draft model: each guess reads it
    with_model = predict(model, "pipeline", [Stage(drafting, (0, 80), True)], [], 8192)
    assert lookup.decode_tps < with_model.decode_tps_drafted < lookup.decode_tps_drafted
    # ranked by decode with drafts when asked, by plain decode otherwise
    nodes = [node("a", 96), node("b", 96), node("slow", 192, 300)]

    def falls(xs):  # the planner compares three significant digits
        xs = [float(f"{x:.3g}") for x in xs]
        return all(x >= y for x, y in zip(xs, xs[1:]))
    drafted = plan(model, nodes, mesh(nodes), 8192, rank="drafted")
    assert len(drafted) > 2 and falls(
        max(p.prediction.decode_tps_drafted, p.decode_tps) for p in drafted)
    assert falls(p.decode_tps for p in plan(model, nodes, mesh(nodes), 8192))


def test_a_draft_model_is_counted_where_it_is_loaded():
    from dataclasses import replace

    from placement_support import dense, node

    from engine.placement.memory import pipeline_rank_memory, refusal

    model, plain = dense(), node("studio", 192)
    drafting = replace(plain, draft_bytes=int(2e9), draft_kv_per_token=100_000.0)
    alone = pipeline_rank_memory(model, plain, (0, 80), True, True, 8192)
    with_draft = pipeline_rank_memory(model, drafting, (0, 80), True, True, 8192)
    assert with_draft.draft == 2e9 + 100_000 * 8192
    assert with_draft.total - alone.total == with_draft.draft
    assert "draft model 2.8 GB" in refusal(drafting, with_draft, (0, 80), 8192)
    # a group's rank 0 loads it (it drafts for the group), no other rank does
    assert pipeline_rank_memory(model, drafting, (0, 40), True, False, 8192).draft == \
        with_draft.draft
    assert pipeline_rank_memory(model, drafting, (40, 80), False, True, 8192).draft == 0
    from engine.placement.memory import tensor_rank_memory
    assert tensor_rank_memory(model, drafting, 2, 8192, first=True).draft == with_draft.draft
    assert tensor_rank_memory(model, drafting, 2, 8192).draft == 0


def test_tensor_ranks_keep_what_mlx_lms_shard_leaves_whole():
    # deepseek_v3's shard() (Kimi K2 runs as it) splits heads and expert widths; q_a_proj,
    # kv_a_proj_with_mqa and each MoE layer's router stay whole on every rank
    from dataclasses import replace

    from engine.placement.memory import Sizer
    from engine.placement.model import LinkSpec, NodeSpec
    from engine.placement.planner import evaluate
    from engine.placement.tables import table

    kimi = profile_model(PROFILES["Kimi-K2"], "Kimi-K2", "4bit")
    whole = 61 * 7168 * (1536 + 512 + 64) + 60 * 384 * 7168  # 1 dense layer, 60 MoE
    # (spread like every layer weight over the model card's 1T parameters)
    assert table(kimi).replicated[-1] == pytest.approx(whole, rel=0.05)
    mac = NodeSpec("m", "m", 500 * 10**9, 819e9, 28e12, rdma=True)
    layers, kept = table(kimi).weights[-1], table(kimi).replicated[-1]
    held = Sizer(kimi, 4096).tensor(mac, 4).weights / kimi.bytes_per_param - kimi.edge_params
    # a quarter of the layers, plus three quarters of what every rank keeps whole
    assert held == pytest.approx(layers / 4 + 0.75 * kept, rel=1e-6)
    # a dense GQA model (llama) shards every layer weight: a rank holds exactly 1/n
    assert table(ModelSpec.from_config(LLAMA_CONFIG, bytes_per_param=2.0)).replicated[-1] == 0
    # decode reads them whole on every tensor rank; one node alone reads them once anyway
    nodes = [replace(mac, id=f"m{i}", name=f"m{i}") for i in range(4)]
    links = [LinkSpec(x.id, y.id, 10e-6, 10e9, rdma) for i, x in enumerate(nodes)
             for y in nodes[i + 1:] for rdma in (True, False)]
    split = replace(kimi, attn_replicated=0)  # as if shard() split the down-projections

    def tps(m: ModelSpec, n: int) -> float:
        return evaluate(m, nodes[:n], links, 4096, "tensor" if n > 1 else "single",
                        [nd.id for nd in nodes[:n]], "jaccl" if n > 1 else "ring",
                        force=True).decode_tps
    assert tps(kimi, 1) == pytest.approx(tps(split, 1), rel=1e-3)
    assert tps(kimi, 4) < 0.98 * tps(split, 4)
