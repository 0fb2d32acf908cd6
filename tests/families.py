"""Tiny random-weight configs of the model families Shoal must split across nodes, built
from mlx-lm's own ModelArgs fields (mlx-lm 0.32.2). Each has 4 layers of width 64 so that
a 2-rank split puts real work on both ranks; the MoE ones route over a handful of experts,
DeepSeek-style ones keep a leading dense layer, hybrid ones mix linear and full attention,
sliding-window ones mix window and full layers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

_BASE = {"hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 128,
         "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
         "max_position_embeddings": 4096, "rope_theta": 10000.0,
         "tie_word_embeddings": False}

_DEEPSEEK = {**_BASE, "model_type": "deepseek_v3", "moe_intermediate_size": 32,
             "n_shared_experts": 1, "n_routed_experts": 8, "num_experts_per_tok": 2,
             "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 24,
             "qk_rope_head_dim": 8, "v_head_dim": 16, "qk_nope_head_dim": 16,
             "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5,
             "num_key_value_heads": 4}

_QWEN35_TEXT = {**_BASE, "model_type": "qwen3_5_text", "head_dim": 16,
                "linear_num_value_heads": 4, "linear_num_key_heads": 2,
                "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                "linear_conv_kernel_dim": 4, "full_attention_interval": 2,
                "rope_parameters": {"type": "default", "rope_theta": 10000.0,
                                    "partial_rotary_factor": 0.5,
                                    "mrope_section": [2, 1, 1]}}

_MINISTRAL3 = {**_BASE, "model_type": "ministral3", "head_dim": 16,
               "layer_types": ["sliding_attention", "full_attention"] * 2,
               "sliding_window": 8, "tie_word_embeddings": False,
               "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                   "llama_4_scaling_beta": 0.1,
                                   "original_max_position_embeddings": 4096}}

_GEMMA3_TEXT = {**_BASE, "model_type": "gemma3_text", "head_dim": 16, "sliding_window": 8,
                "sliding_window_pattern": 2, "query_pre_attn_scalar": 16}

FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {**_BASE, "model_type": "llama"},
    "mistral": {**_BASE, "model_type": "mistral"},  # mlx-lm remaps it to llama
    "qwen2": {**_BASE, "model_type": "qwen2"},
    "qwen3": {**_BASE, "model_type": "qwen3", "head_dim": 16},
    "qwen3_moe": {**_BASE, "model_type": "qwen3_moe", "head_dim": 16, "num_experts": 8,
                  "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
                  "moe_intermediate_size": 32, "norm_topk_prob": True},
    "deepseek_v3": _DEEPSEEK,
    "kimi_k2": {**_DEEPSEEK, "model_type": "kimi_k2"},  # remapped to deepseek_v3
    "kimi_k25": {"model_type": "kimi_k25", "text_config": {**_DEEPSEEK}},
    "glm4_moe": {**_BASE, "model_type": "glm4_moe", "head_dim": 16, "moe_intermediate_size": 32,
                 "norm_topk_prob": True, "n_group": 1, "topk_group": 1, "n_shared_experts": 1,
                 "n_routed_experts": 8, "routed_scaling_factor": 1.0, "num_experts_per_tok": 2,
                 "first_k_dense_replace": 1, "rope_scaling": None, "use_qk_norm": True,
                 "attention_bias": True, "partial_rotary_factor": 0.5},
    "gpt_oss": {**_BASE, "model_type": "gpt_oss", "head_dim": 16, "num_local_experts": 4,
                "num_experts_per_tok": 2, "sliding_window": 8,
                "layer_types": ["sliding_attention", "full_attention"] * 2},
    "qwen3_next": {**_BASE, "model_type": "qwen3_next", "head_dim": 16,
                   "linear_num_value_heads": 4, "linear_num_key_heads": 2,
                   "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                   "linear_conv_kernel_dim": 4, "num_experts": 4, "num_experts_per_tok": 2,
                   "decoder_sparse_step": 1, "shared_expert_intermediate_size": 32,
                   "moe_intermediate_size": 32, "mlp_only_layers": [],
                   "full_attention_interval": 2, "partial_rotary_factor": 0.5,
                   "norm_topk_prob": True},
    "qwen3_5": {"model_type": "qwen3_5", "text_config": _QWEN35_TEXT,
                "tie_word_embeddings": False},
    "qwen3_5_moe": {"model_type": "qwen3_5_moe", "tie_word_embeddings": False,
                    "text_config": {**_QWEN35_TEXT, "model_type": "qwen3_5_moe_text",
                                    "num_experts": 4, "num_experts_per_tok": 2,
                                    "shared_expert_intermediate_size": 32,
                                    "moe_intermediate_size": 32}},
    "gemma3_text": _GEMMA3_TEXT,
    "gemma3": {"model_type": "gemma3", "text_config": {**_GEMMA3_TEXT}},  # multimodal
    "ministral3": _MINISTRAL3,
    "mistral3": {"model_type": "mistral3", "text_config": {**_MINISTRAL3}},  # multimodal
    "phi3": {**_BASE, "model_type": "phi3"},
    "granite": {**_BASE, "model_type": "granite", "logits_scaling": 4.0,
                "attention_multiplier": 0.25, "embedding_multiplier": 6.0,
                "residual_multiplier": 0.5, "attention_bias": False, "mlp_bias": False},
    "olmo2": {**_BASE, "model_type": "olmo2"},
    "minimax": {**_BASE, "model_type": "minimax", "head_dim": 16, "num_experts_per_tok": 2,
                "num_local_experts": 4, "shared_intermediate_size": 0, "rotary_dim": 8},
}


def make_family_model(folder: Path, family: str, seed: int = 0) -> Path:
    """A random-weight model folder of `family` that mlx_lm.load() accepts, with the byte
    tokenizer of tests/tiny.py. The end-of-turn token's logit is pinned to 0 as there."""
    import json

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes as get_model_classes

    from tiny import SPECIALS, write_byte_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    tokens = write_byte_tokenizer(folder)
    vocab = -(-tokens // 8) * 8  # padded, as real checkpoints are, so heads split evenly
    config = json.loads(json.dumps(FAMILIES[family]))
    config["vocab_size"] = vocab
    if "text_config" in config:
        config["text_config"]["vocab_size"] = vocab
    model_cls, args_cls = get_model_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    head = next((k for k in weights if k.endswith("lm_head.weight")), None) or \
        next(k for k in weights if k.endswith("embed_tokens.weight"))
    eos = SPECIALS.index("<|im_end|>") + tokens - len(SPECIALS)
    w = weights[head]  # the padding rows' logits are 0 too: never sampled
    rows = mx.arange(w.shape[0])
    weights[head] = w * ((rows != eos) & (rows < tokens))[:, None]
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder
