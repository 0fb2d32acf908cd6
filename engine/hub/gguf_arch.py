"""Per-architecture knowledge for GGUF import: tensor names (llama.cpp's gguf-py
constants.py, MODEL_TENSORS) mapped to mlx-lm parameter names, the config.json each
architecture needs, and the fixes llama.cpp's converter applied that must be undone.

- llama/mistral: convert_hf_to_gguf permutes Q/K rows for llama.cpp's interleaved RoPE.
- gemma3: the converter stores every `*norm.weight` as 1 + w (Gemma's RMSNorm scales by
  1 + w); mlx-lm's gemma3_text adds the 1 itself, so 1 is subtracted on import.
- qwen3moe: experts are already stacked (ffn_*_exps: experts × out × in), exactly the
  layout of mlx-lm's qwen3_moe switch_mlp; llama.cpp renormalises the top-k weights.
- phi3: attn_qkv and ffn_up hold the fused [q; k; v] and [gate; up] that mlx-lm's phi3
  keeps fused as qkv_proj and gate_up_proj.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from engine.errors import CorruptModel, UnsupportedModel
from engine.hub.gguf_reader import GGUFHeader
from engine.hub.gguf_rope import (
    ROPE_FREQS,
    ROPE_LONG,
    ROPE_SHORT,
    llama3_rope_scaling,
    phi3_longrope,
)

IMPORTER_VERSION = 2

_ATTENTION = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
              "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj"}
_QK_NORM = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_MLP = {"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_NORMS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_EXPERTS = {"ffn_gate_inp": "mlp.gate", "ffn_gate_exps": "mlp.switch_mlp.gate_proj",
            "ffn_up_exps": "mlp.switch_mlp.up_proj",
            "ffn_down_exps": "mlp.switch_mlp.down_proj"}


@dataclass(frozen=True)
class ArchSpec:
    model_type: str  # mlx-lm's model file
    hf_class: str
    layer: dict[str, str]  # blk.N.<part> -> model.layers.N.<module>
    required: tuple[str, ...]  # parts every layer must have
    # alternatives: a layer must hold every part of one of these sets (dense or MoE MLP)
    mlp_sets: tuple[tuple[str, ...], ...] = ()
    extra_globals: frozenset[str] = frozenset()  # tensors read into config.json
    permute_qk: bool = False
    norm_shift: float = 0.0
    skipped_prefixes: tuple[str, ...] = ()  # tensors of another model in the same file
    biases: frozenset[str] = field(default_factory=frozenset)  # parts that may carry .bias


def _spec(model_type: str, hf_class: str, layer: dict[str, str], *,
          optional: tuple[str, ...] = (), **kw: Any) -> ArchSpec:
    required = tuple(p for p in layer if p not in optional)
    return ArchSpec(model_type, hf_class, layer, required, **kw)


_LLAMA = _spec("llama", "LlamaForCausalLM", _NORMS | _ATTENTION | _MLP, permute_qk=True,
               extra_globals=frozenset({ROPE_FREQS}))
SPECS: dict[str, ArchSpec] = {
    "llama": _LLAMA,
    "mistral": _LLAMA,  # Mistral GGUFs are llama models under another name
    "qwen2": _spec("qwen2", "Qwen2ForCausalLM", _NORMS | _ATTENTION | _MLP,
                   biases=frozenset({"attn_q", "attn_k", "attn_v"})),
    "qwen3": _spec("qwen3", "Qwen3ForCausalLM", _NORMS | _ATTENTION | _QK_NORM | _MLP),
    "qwen3moe": _spec("qwen3_moe", "Qwen3MoeForCausalLM",
                      _NORMS | _ATTENTION | _QK_NORM | _MLP | _EXPERTS,
                      optional=tuple(_MLP) + tuple(_EXPERTS),
                      mlp_sets=(tuple(_EXPERTS), tuple(_MLP))),
    "gemma3": _spec("gemma3_text", "Gemma3ForCausalLM",
                    {"attn_norm": "input_layernorm",
                     "post_attention_norm": "post_attention_layernorm",
                     "ffn_norm": "pre_feedforward_layernorm",
                     "post_ffw_norm": "post_feedforward_layernorm"}
                    | _ATTENTION | _QK_NORM | _MLP,
                    norm_shift=1.0, skipped_prefixes=("v.", "mm.")),
    "phi3": _spec("phi3", "Phi3ForCausalLM",
                  _NORMS | {"attn_qkv": "self_attn.qkv_proj", "attn_output": "self_attn.o_proj",
                            "ffn_up": "mlp.gate_up_proj", "ffn_down": "mlp.down_proj"},
                  extra_globals=frozenset({ROPE_LONG, ROPE_SHORT})),
}
SUPPORTED_ARCHITECTURES = tuple(SPECS)

_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                 "output": "lm_head"}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)")


def spec_for(header: GGUFHeader) -> ArchSpec:
    """The architecture's spec; UnsupportedModel naming it (and what is supported) if none."""
    arch = header.architecture
    if arch not in SPECS:
        raise UnsupportedModel(
            f"{header.path.name} is a {arch or 'unknown'} model; Shoal can import GGUF "
            f"architectures {', '.join(SUPPORTED_ARCHITECTURES)}.")
    return SPECS[arch]


def mlx_name(spec: ArchSpec, gguf_name: str) -> str | None:
    """The mlx-lm parameter name for a GGUF tensor name, or None if the spec lacks it."""
    base, _, suffix = gguf_name.rpartition(".")
    if suffix not in ("weight", "bias"):
        return None
    if base in _GLOBAL_NAMES:
        return None if suffix == "bias" else f"{_GLOBAL_NAMES[base]}.{suffix}"
    m = _LAYER_RE.fullmatch(base)
    if not m or m.group(2) not in spec.layer:
        return None
    if suffix == "bias" and m.group(2) not in spec.biases:
        return None
    return f"model.layers.{m.group(1)}.{spec.layer[m.group(2)]}.{suffix}"


def layer_part(gguf_name: str) -> str:
    """"attn_q" for "blk.3.attn_q.weight"; "" for global tensors."""
    return gguf_name.split(".")[2] if gguf_name.startswith("blk.") else ""


def check_layers(header: GGUFHeader, spec: ArchSpec) -> None:
    """CorruptModel when a layer lacks a tensor its architecture needs."""
    n_layers = get_int(header, "block_count")
    present = {t.name for t in header.tensors}
    missing = [n for n in ("token_embd.weight", "output_norm.weight") if n not in present]
    for i in range(n_layers):
        missing += [f"blk.{i}.{p}.weight" for p in spec.required
                    if f"blk.{i}.{p}.weight" not in present]
        if spec.mlp_sets:  # name what the closest complete set (experts or dense) lacks
            lacking = [[f"blk.{i}.{p}.weight" for p in parts
                        if f"blk.{i}.{p}.weight" not in present] for parts in spec.mlp_sets]
            closest: list[str] = min(lacking, key=len)
            missing += closest
    if missing:
        raise CorruptModel(f"{header.path.name} lacks tensors its header promises, e.g. "
                           f"{', '.join(missing[:3])} ({len(missing)} missing).")


def get_int(header: GGUFHeader, key: str, default: int | None = None) -> int:
    full = f"{header.architecture}.{key}"
    value = header.get(full, default)
    if isinstance(value, list):
        raise UnsupportedModel(f"{header.path.name} sets {full} per layer; Shoal imports "
                               f"models whose layers all have the same shape.")
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise CorruptModel(f"{header.path.name} lacks a valid {full} ({value!r}).")
    return value


def build_config(header: GGUFHeader) -> dict[str, Any]:
    """The Hugging Face / mlx-lm config.json for a GGUF header."""
    spec = spec_for(header)
    a = header.architecture
    hidden, heads = get_int(header, "embedding_length"), get_int(header, "attention.head_count")
    names = {t.name: t for t in header.tensors}
    tokens = header.get("tokenizer.ggml.tokens")
    # The embedding's rows are what the weights need; a vocabulary may list fewer tokens.
    vocab = names["token_embd.weight"].dims[1] if "token_embd.weight" in names else (
        header.get(f"{a}.vocab_size") or (len(tokens) if isinstance(tokens, list) else None))
    eps = header.get(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
    config: dict[str, Any] = {
        "architectures": [spec.hf_class],
        "model_type": spec.model_type,
        "hidden_size": hidden,
        "num_hidden_layers": get_int(header, "block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": get_int(header, "attention.head_count_kv", heads),
        "rms_norm_eps": float(f"{eps:.6g}"),  # float32 in the file: 9.9999997e-06 -> 1e-05
        # llama.cpp's default when the key is absent; mlx-lm reads rope_theta only.
        "rope_theta": float(header.get(f"{a}.rope.freq_base", 10000.0)),
        "max_position_embeddings": get_int(header, "context_length", 4096),
        "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in names,
        "shoal_import": {"importer_version": IMPORTER_VERSION, "source": header.path.name,
                         "gguf_architecture": a, "name": header.get("general.name")},
    }
    if spec.model_type != "qwen3_moe" or f"{a}.feed_forward_length" in header.metadata:
        config["intermediate_size"] = get_int(header, "feed_forward_length")
    natural = hidden // heads
    head_dim = header.get(f"{a}.attention.key_length")
    head_dim = head_dim if isinstance(head_dim, int) and head_dim > 0 else natural
    rope_dim = header.get(f"{a}.rope.dimension_count")
    rope_dim = rope_dim if isinstance(rope_dim, int) and rope_dim > 0 else head_dim
    if head_dim != natural and spec.model_type in ("qwen2", "phi3"):
        raise UnsupportedModel(f"{header.path.name} has head size {head_dim} != "
                               f"{hidden}/{heads}, which mlx-lm's {spec.model_type} can't hold.")
    if head_dim != natural or spec.model_type in ("qwen3", "qwen3_moe", "gemma3_text"):
        config["head_dim"] = head_dim
    if rope_dim != head_dim and spec.model_type != "phi3":
        raise UnsupportedModel(f"{header.path.name} rotates only {rope_dim} dims per head "
                               f"(partial RoPE), which Shoal's importer does not support.")
    config["rope_scaling"] = _rope_scaling(header, spec, float(config["rope_theta"]), rope_dim)
    if config["rope_scaling"] is None:
        del config["rope_scaling"]
    _FAMILY[spec.model_type](header, config, rope_dim)
    return config


def _rope_scaling(header: GGUFHeader, spec: ArchSpec, base: float,
                  dims: int) -> dict[str, Any] | None:
    names = {t.name for t in header.tensors}
    a = header.architecture
    scaling = header.get(f"{a}.rope.scaling.type")
    if ROPE_FREQS in names and ROPE_FREQS in spec.extra_globals:
        return llama3_rope_scaling(header, base, dims)
    if spec.model_type == "phi3" and names & {ROPE_LONG, ROPE_SHORT}:
        return phi3_longrope(header, dims)
    if scaling == "linear":
        return {"type": "linear", "factor": float(header.get(f"{a}.rope.scaling.factor", 1.0))}
    if scaling not in (None, "none"):
        raise UnsupportedModel(f"{header.path.name} uses RoPE scaling {scaling!r}; Shoal's "
                               f"importer supports none and linear.")
    return None


def _llama(header: GGUFHeader, config: dict[str, Any], rope_dim: int) -> None:
    config["hidden_act"] = "silu"
    if config["model_type"] == "llama":
        config["attention_bias"] = any(t.name == "blk.0.attn_q.bias" for t in header.tensors)
        config["mlp_bias"] = False


def _qwen3_moe(header: GGUFHeader, config: dict[str, Any], rope_dim: int) -> None:
    a = header.architecture
    config["hidden_act"] = "silu"
    config["num_experts"] = get_int(header, "expert_count")
    config["num_experts_per_tok"] = get_int(header, "expert_used_count")
    config["moe_intermediate_size"] = get_int(header, "expert_feed_forward_length")
    config.setdefault("intermediate_size", config["moe_intermediate_size"])
    names = {t.name for t in header.tensors}
    config["decoder_sparse_step"] = 1
    config["mlp_only_layers"] = [i for i in range(config["num_hidden_layers"])
                                 if f"blk.{i}.ffn_gate_exps.weight" not in names]
    # llama.cpp's qwen3moe graph renormalises the top-k weights unless a file says not to.
    config["norm_topk_prob"] = bool(header.get(f"{a}.expert_weights_norm", True))
    gating = header.get(f"{a}.expert_gating_func", 1)  # llama.cpp: 1 softmax, 2 sigmoid
    if gating != 1:
        raise UnsupportedModel(f"{header.path.name} routes experts with gating function "
                               f"{gating!r}; mlx-lm's qwen3_moe routes with softmax only.")


def _gemma3(header: GGUFHeader, config: dict[str, Any], rope_dim: int) -> None:
    a = header.architecture
    config["hidden_activation"] = "gelu_pytorch_tanh"
    config["sliding_window"] = get_int(header, "attention.sliding_window", 4096)
    # llama.cpp hard-codes both: every 6th layer global, local layers at base 10000.
    config["sliding_window_pattern"] = _gemma3_pattern(header)
    config["rope_local_base_freq"] = float(header.get(f"{a}.rope.freq_base_swa", 10000.0))
    # As llama.cpp: 1/sqrt(head_dim), except Gemma 3 27B (62 layers), which scales by
    # 1/sqrt(hidden/heads) like its Hugging Face config's query_pre_attn_scalar 168.
    config["query_pre_attn_scalar"] = (
        config["hidden_size"] // config["num_attention_heads"]
        if config["num_hidden_layers"] == 62 else config["head_dim"])


def _gemma3_pattern(header: GGUFHeader) -> int:
    value = header.get(f"{header.architecture}.attention.sliding_window_pattern", 6)
    if isinstance(value, list):  # per-layer flags, True = sliding: must repeat every N
        period = next((i + 1 for i, swa in enumerate(value) if not swa), len(value) + 1)
        if all(bool(swa) == ((i + 1) % period != 0) for i, swa in enumerate(value)):
            return period
    elif isinstance(value, int) and value > 0:
        return value
    raise UnsupportedModel(f"{header.path.name} mixes sliding and global attention layers "
                           f"in a pattern mlx-lm's gemma3_text can't express.")


def _phi3(header: GGUFHeader, config: dict[str, Any], rope_dim: int) -> None:
    a = header.architecture
    config["hidden_act"] = "silu"
    config["original_max_position_embeddings"] = get_int(
        header, "rope.scaling.original_context_length", config["max_position_embeddings"])
    natural = config["hidden_size"] // config["num_attention_heads"]
    if rope_dim != natural:
        config["partial_rotary_factor"] = rope_dim / natural
    if f"{a}.attention.sliding_window" in header.metadata:
        config["sliding_window"] = header.get(f"{a}.attention.sliding_window")


_FAMILY = {"llama": _llama, "qwen2": _llama, "qwen3": _llama, "qwen3_moe": _qwen3_moe,
           "gemma3_text": _gemma3, "phi3": _phi3}
