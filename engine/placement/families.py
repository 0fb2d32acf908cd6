"""Which strategies a model family can run with: the one rule the planner's rankings,
POST /shoal/plan, the GUI's placement view and POST /shoal/instances all apply.

Pure: a config.json model_type in, a reason out. The tables are mlx-lm 0.32.2's own facts
(tests/engine/placement/test_families.py checks them against the installed package):
- pipeline: any family whose layers form a list runs through its own code
  (engine/runtime/stage.py), so only families known to break are listed;
- tensor: the families whose Model has `shard()`, and the wrappers Shoal splits itself.
"""

from __future__ import annotations

from typing import Any

# mlx-lm's MODEL_REMAPPING: checkpoint model_type → the module that runs it.
REMAPPING = {
    "mistral": "llama", "llava": "mistral3", "phi-msft": "phixtral", "falcon_mamba": "mamba",
    "joyai_llm_flash": "deepseek_v3", "kimi_k2": "deepseek_v3", "qwen2_5_vl": "qwen2_vl",
    "minimax_m2": "minimax", "iquestcoder": "llama", "xverse": "llama",
    "gemma4_unified": "gemma4", "deepseek_v41_text": "deepseek_v41",
}

# Modules whose Model has shard() (tensor parallel).
TENSOR_FAMILIES = frozenset({
    "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_v41", "exaone_moe", "glm4_moe",
    "glm4_moe_lite", "glm_moe_dsa", "gpt_oss", "iquestloopcoder", "kimi_k25", "kimi_k3",
    "llama", "longcat_flash", "longcat_flash_ngram", "minimax", "minimax_m3_vl",
    "ministral3", "mistral4", "muse_spark", "prism_hadamard_qwen35", "qwen2", "qwen3",
    "qwen3_5", "qwen3_5_moe", "qwen3_moe", "solar_open", "step3p5",
})

# Wrappers whose language model Shoal splits itself where mlx-lm's Model has no shard()
# (engine/runtime/group/tensor_split.py): vision checkpoints' Gemma 3, Mistral 3, Qwen-VL.
SPLIT_BY_SHOAL = frozenset({"gemma3", "mistral3", "qwen2_vl", "qwen3_vl", "qwen3_vl_moe"})

# Tensor families whose shard() splits an untied head by vocabulary rows.
VOCAB_SHARDED = frozenset({"qwen3_5", "qwen3_5_moe"})

# Families whose forward pass is not one loop of hidden states through `model.layers`.
PIPELINE_REFUSED = {
    "gemma3n": "its layers pass several stacked hidden states and per-layer inputs "
               "computed from the token ids",
}


# Families whose batched forward pass mlx-lm gets wrong: they run one request at a time.
UNBATCHED = {
    "bailing_moe_linear": "its linear-attention layers ignore the batch's padding, so a "
                          "request batched with a shorter one gets other tokens",
}


def batching_refusal(model_type: str) -> str | None:
    """Why requests of `model_type` can't decode together (then they take turns), or None."""
    family = resolve(model_type)
    return f"{family} models run one request at a time: {UNBATCHED[family]}" \
        if family in UNBATCHED else None


def resolve(model_type: str) -> str:
    """The mlx-lm module that runs checkpoints of `model_type`."""
    return REMAPPING.get(model_type, model_type)


def strategy_refusal(model_type: str, strategy: str) -> str | None:
    """Why `strategy` ("single", "pipeline", "tensor") can't run `model_type`, or None."""
    family = resolve(model_type)
    named = model_type if family == model_type else f"{model_type} (run as {family})"
    if strategy == "pipeline" and family in PIPELINE_REFUSED:
        return (f"{named} models can't be split into a pipeline: "
                f"{PIPELINE_REFUSED[family]}; run it on one node")
    if strategy == "tensor" and family not in TENSOR_FAMILIES | SPLIT_BY_SHOAL:
        return (f"{named} models can't run tensor parallel: mlx-lm has no tensor split "
                "(shard()) for them; use pipeline")
    return None


# --- quantized KV ---------------------------------------------------------------------
BITS = (4, 8)
GROUP = 64


def kv_group(config: Any, bits: int) -> int:
    """The quantization group size for a model's KV at `bits`, from its config (a dict,
    or mlx-lm's model args): 64, or 32 where its heads are narrower; a ValueError naming
    what doesn't fit otherwise."""
    if bits not in BITS:
        raise ValueError(f"kv_bits must be one of {', '.join(map(str, BITS))} (or left "
                         f"out for 16-bit KV), not {bits}")
    c = config if isinstance(config, dict) else vars(config)
    c = c.get("text_config") or c  # a multimodal checkpoint's language model
    dims = {c.get("head_dim") or c.get("hidden_size", 0) // (c.get("num_attention_heads")
                                                             or 1)}
    for name in ("v_head_dim", "kv_lora_rank"):  # MLA's values and latent
        if c.get(name):
            dims.add(int(c[name]))
    if c.get("qk_nope_head_dim"):
        dims.add(int(c["qk_nope_head_dim"]) + int(c.get("qk_rope_head_dim") or 0))
    for group in (GROUP, 32):
        if all(d and d % group == 0 for d in dims):
            return group
    raise ValueError(f"this model's attention heads are {sorted(dims)} wide, which "
                     f"quantized KV can't split into groups of 32 or 64: leave kv_bits "
                     f"out for it")
