"""What the planner knows about machines, links and models: plain frozen numbers.

Units are SI throughout: bytes, bytes per second, FLOP/s, seconds. Parameter counts come
from the architecture (config.json) so a layer range can be weighed exactly; a figure from
a model card (total/active parameters) may override the sum and is then spread over the
layers in the same proportions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from engine.modelconfig import context_length
from engine.placement.families import strategy_refusal
from engine.placement.validate import PlacementError

PLANNING_CONTEXT_CAP = 32768  # the context a plan assumes unless asked for another


def planning_context(context_length: int) -> int:
    """The context the planner plans a model for by default."""
    return min(context_length, PLANNING_CONTEXT_CAP)


# Bytes per parameter of the usual formats. MLX affine quantization stores a float16
# scale and bias per group (4 bytes / group_size); mxfp formats one 8-bit scale per group.
QUANTIZATIONS: dict[str, float] = {
    "bf16": 2.0, "fp16": 2.0, "8bit": 1 + 4 / 64, "6bit": 0.75 + 4 / 64,
    "5bit": 0.625 + 4 / 64, "4bit": 0.5 + 4 / 64, "3bit": 0.375 + 4 / 64,
    "mxfp4": 0.5 + 1 / 32,
}
_DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "float32": 4.0, "float8_e4m3fn": 1.0}


@dataclass(frozen=True)
class NodeSpec:
    """One machine. memory_bytes is what the GPU may use (on macOS Metal's working set, as
    engine/telemetry/memory.py finds it), not the RAM size."""
    id: str
    name: str
    memory_bytes: int
    memory_bandwidth_Bps: float
    compute_flops: float
    has_model_files: bool = False
    rdma: bool = False
    # its draft model (speculative decoding), loaded beside a model it serves alone:
    # weights, and KV bytes per token of context
    draft_bytes: int = 0
    draft_kv_per_token: float = 0.0
    # FLOP/s its attention gets, as measured (engine/telemetry/calibrate.py); 0: the share
    # of compute_flops a matmul gets, as fused attention kernels on a GPU do
    attention_flops: float = 0.0
    # FLOP/s a prefill chunk's matmuls really get, as measured on a decoder layer of each
    # width: (hidden size, FLOP/s), narrowest first; (): compute_flops' share
    prefill_flops: tuple[tuple[int, float], ...] = ()
    # MLX runs on its CPU: quantized weights are unpacked to float32 where they fit
    unpacks: bool = False
    # serves a GGUF import alone on llama.cpp, its weights as the file has them
    # (engine/node/cpu_engine.py): no unpacking to float32
    reads_gguf: bool = False
    # watts it draws running a model: measured while it served, else the catalogued
    # maximum (an upper bound); 0: unknown
    watts: float = 0.0
    # its speed is a guess: no measurement, no profile of its chip (just started)
    guessed: bool = False


@dataclass(frozen=True)
class LinkSpec:
    """A link between two nodes; rdma=True means jaccl can use it (Thunderbolt 5 RDMA)."""
    a: str
    b: str
    latency_s: float
    bandwidth_Bps: float
    rdma: bool = False


@dataclass(frozen=True)
class ModelSpec:
    """A model's shape and weight format. Zero means "derive it from the other fields"."""
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP width
    vocab: int
    bytes_per_param: float
    experts: int = 0
    active_experts: int = 0
    moe_intermediate: int = 0
    shared_experts: int = 0
    dense_layers: int = 0  # leading layers that keep a dense MLP in a MoE model
    tie_embeddings: bool = False
    attn_params: int = 0  # per layer; 0 = q/k/v/o projections from the head counts
    # per layer, of attn_params: weights mlx-lm's shard() leaves whole on every tensor rank
    # (MLA's down-projections to the latents); MoE routers are counted by layer_replicated
    attn_replicated: int = 0
    kv_dim: int = 0  # cached elements per token and layer, K and V together
    kv_sharded: bool = True  # tensor parallel splits the cache (not MLA's shared latent)
    score_dim: int = 0  # per head and cached token: elements in q.k plus a.v
    windows: tuple[int, ...] = ()  # per-layer sliding window, 0 = full attention
    total_params: int = 0
    active_params: int = 0  # per token: active layer weights + the output head
    context: int = 32768
    model_type: str = ""
    shardable: bool = True
    kv_bytes: float = 2  # per value: the activation dtype, or quantized (kv_value_bytes)
    gguf: bool = False  # imported from a GGUF file, which llama.cpp reads as it is
    _raw: tuple[float, float] = field(default=(0.0, 0.0), init=False, repr=False,
                                      compare=False)

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "vocab"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise PlacementError(f"model {self.name!r}: {name} must be a positive "
                                     f"whole number, got {v!r}")
        if not self.bytes_per_param > 0:
            raise PlacementError(f"model {self.name!r}: bytes_per_param must be positive")
        if self.experts and not 0 < self.active_experts <= self.experts:
            raise PlacementError(f"model {self.name!r}: active_experts must be 1-"
                                 f"{self.experts}, got {self.active_experts}")
        if self.windows and len(self.windows) != self.layers:
            raise PlacementError(f"model {self.name!r}: {len(self.windows)} windows for "
                                 f"{self.layers} layers")
        raw_total = sum(self._layer_raw(i, False) for i in range(self.layers))
        raw_active = sum(self._layer_raw(i, True) for i in range(self.layers))
        object.__setattr__(self, "_raw", (raw_total, raw_active))
        if not self.total_params:
            object.__setattr__(self, "total_params", round(raw_total + self.edge_params))
        if not self.active_params:
            object.__setattr__(self, "active_params", round(raw_active + self.head_params))
        if self.total_params <= self.edge_params or self.active_params <= self.head_params:
            raise PlacementError(f"model {self.name!r}: total/active parameters are smaller "
                                 f"than its embeddings")

    # --- parameters, per layer and at the ends --------------------------------------------
    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """The output projection (the tied embedding matrix when tied)."""
        return self.vocab * self.hidden

    @property
    def edge_params(self) -> int:
        return self.embed_params + (0 if self.tie_embeddings else self.head_params)

    def is_moe(self, i: int) -> bool:
        return self.experts > 0 and i >= self.dense_layers

    def _layer_raw(self, i: int, active: bool) -> float:
        attn = self.attn_params or self.hidden * self.head_dim * (2 * self.heads +
                                                                   2 * self.kv_heads)
        if not self.is_moe(i):
            return attn + 3 * self.hidden * self.intermediate + 2 * self.hidden
        expert = 3 * self.hidden * self.moe_intermediate
        n = self.active_experts if active else self.experts
        return attn + (n + self.shared_experts) * expert + self.experts * self.hidden

    def layer_params(self, i: int) -> float:
        """Weights stored for layer i."""
        raw_total = self._raw[0]
        layer_total = self.total_params - self.edge_params
        if raw_total <= 0:
            return layer_total / self.layers
        return self._layer_raw(i, False) * layer_total / raw_total

    def layer_active_params(self, i: int) -> float:
        """Weights read for one token in layer i (routed experts only, for MoE)."""
        raw_active = self._raw[1]
        layer_active = self.active_params - self.head_params
        if raw_active <= 0:
            return layer_active / self.layers
        return self._layer_raw(i, True) * layer_active / raw_active

    def layer_replicated_params(self, i: int) -> float:
        """Weights of layer i every tensor rank holds and reads whole (mlx-lm's shard()
        splits heads and MLP widths, not these): MLA's q and kv down-projections, and a
        MoE layer's router."""
        raw = self.attn_replicated + (self.experts * self.hidden if self.is_moe(i) else 0)
        raw_total = self._raw[0]
        if raw_total <= 0:
            return 0.0
        return raw * (self.total_params - self.edge_params) / raw_total

    def layer_kv_tokens(self, i: int, context: int) -> int:
        w = self.windows[i] if self.windows else 0
        return min(context, w) if w else context

    @property
    def kv_per_token(self) -> int:
        """Cache elements per token and layer (K and V)."""
        return self.kv_dim or 2 * self.kv_heads * self.head_dim

    @property
    def score_per_head(self) -> int:
        return self.score_dim or 2 * self.head_dim

    def with_quantization(self, bytes_per_param: float) -> ModelSpec:
        return replace(self, bytes_per_param=bytes_per_param)

    def with_kv_bits(self, bits: int | None) -> ModelSpec:
        """Its KV kept at `bits` (8 or 4; None: 16 bits)."""
        return replace(self, kv_bytes=kv_value_bytes(bits))

    # --- from an mlx-lm / Hugging Face config.json ----------------------------------------
    @classmethod
    def from_config(cls, config: Mapping[str, Any], bytes_per_param: float | None = None,
                    name: str | None = None, weight_bytes: float | None = None,
                    context: int | None = None) -> ModelSpec:
        """Read the shape from a config.json dict (llama, qwen2/3, mistral, qwen3_moe,
        deepseek_v3, kimi_k2, gpt_oss...). bytes_per_param defaults to what the config's
        quantization (or torch_dtype) says; `weight_bytes` (what the checkpoint's tensors
        take in memory: mixed bits, layers left unquantized) overrides it. `context` is the
        model's window where the caller knows it better than config.json says."""
        cfg = {**config, **(config.get("text_config") or {})}
        mtype = str(config.get("model_type") or cfg.get("model_type") or "")

        def num(*keys: str, default: int | None = None) -> int:
            for k in keys:
                v = cfg.get(k)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    return int(v)
            if default is None:
                raise PlacementError(f"config.json has no {' / '.join(keys)}")
            return default

        hidden = num("hidden_size", "d_model", "n_embd")
        heads = num("num_attention_heads", "n_head")
        kv_heads = num("num_key_value_heads", default=heads)
        head_dim = num("head_dim", default=hidden // heads)
        layers = num("num_hidden_layers", "n_layer")
        experts = num("n_routed_experts", "num_experts", "num_local_experts", default=0)
        extra: dict[str, Any] = {}
        if experts:
            mlp_only = set(cfg.get("mlp_only_layers") or [])
            if mlp_only:
                raise PlacementError("configs with mlp_only_layers are not modelled yet")
            extra.update(experts=experts,
                         active_experts=num("num_experts_per_tok", "experts_per_token",
                                            "moe_topk"),
                         moe_intermediate=num("moe_intermediate_size",
                                              default=num("intermediate_size")),
                         shared_experts=num("n_shared_experts", default=0),
                         dense_layers=num("first_k_dense_replace", default=0))
        if cfg.get("kv_lora_rank"):  # multi-head latent attention (DeepSeek V2/V3, Kimi K2)
            q_lora, kv_lora = num("q_lora_rank", default=0), num("kv_lora_rank")
            rope, nope = num("qk_rope_head_dim"), num("qk_nope_head_dim")
            v = num("v_head_dim", default=nope)
            q = hidden * q_lora + q_lora * heads * (nope + rope) if q_lora else \
                hidden * heads * (nope + rope)
            head_dim = v  # the per-head width of the k/v that prefill expands
            extra.update(attn_params=q + hidden * (kv_lora + rope) +
                         kv_lora * heads * (nope + v) + heads * v * hidden,
                         # q_a_proj and kv_a_proj_with_mqa: shard() splits only by head
                         attn_replicated=hidden * (q_lora + kv_lora + rope),
                         # mlx-lm caches the compressed latent plus the rope key
                         kv_dim=kv_lora + rope, kv_sharded=False,
                         score_dim=2 * kv_lora + rope)
        types = cfg.get("layer_types")
        window = num("sliding_window", default=0)
        if isinstance(types, list) and window and len(types) == layers:
            extra["windows"] = tuple(window if t == "sliding_attention" else 0 for t in types)
        if bytes_per_param is None:
            bytes_per_param = quantized_bytes_per_param(
                config.get("quantization") or config.get("quantization_config"),
                str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"))
        window = context or context_length(config, fallback=PLANNING_CONTEXT_CAP)
        spec = cls(name=name or str(config.get("_name_or_path") or mtype or "model"),
                   layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                   head_dim=head_dim, intermediate=num("intermediate_size", default=0),
                   vocab=num("vocab_size"), bytes_per_param=bytes_per_param,
                   tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                   context=planning_context(window), model_type=mtype,
                   shardable=strategy_refusal(mtype, "tensor") is None,
                   gguf=isinstance(config.get("shoal_import"), Mapping), **extra)
        if weight_bytes and weight_bytes > 0:  # the checkpoint's real size beats the format
            spec = spec.with_quantization(weight_bytes / spec.total_params)
        return spec


def quantized_bytes_per_param(quant: Any, dtype: str = "bfloat16") -> float:
    """Bytes per weight for an mlx-lm "quantization" block ({"bits", "group_size", "mode"}),
    or the plain dtype when there is none."""
    if isinstance(quant, Mapping) and not quant.get("bits"):  # Hugging Face's own block
        method = str(quant.get("quant_method", ""))
        if method == "fp8":  # mlx-lm unpacks FP8 blocks to bfloat16 at load, unless their
            mx = quant.get("scale_fmt") == "ue8m0" and \
                list(quant.get("weight_block_size") or ()) == [32, 32]  # scales make mxfp8
            return 1 + 1 / 32 if mx else 2.0
        if method == "mxfp4":
            return QUANTIZATIONS["mxfp4"]
    if not isinstance(quant, Mapping) or not quant.get("bits"):
        return _DTYPE_BYTES.get(dtype, 2.0)
    bits, group = quant["bits"], quant.get("group_size") or 64
    if not isinstance(bits, int) or not isinstance(group, int) or bits <= 0 or group <= 0:
        raise PlacementError(f"quantization: bits and group_size must be positive whole "
                             f"numbers, got {dict(quant)}")
    scale = 1 if str(quant.get("mode", "affine")).startswith(("mx", "nv")) else 4
    return bits / 8 + scale / group


def kv_value_bytes(bits: int | None) -> float:
    """Bytes a KV value takes: 2 at 16 bits; quantized, bits / 8 plus a 16-bit scale and
    bias per group of 64 (engine/runtime/quant_kv.py)."""
    return 2.0 if bits is None else bits / 8 + 4 / 64
