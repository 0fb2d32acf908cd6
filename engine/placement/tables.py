"""The model's assumptions in one place, and per-layer prefix sums so that any layer range
is weighed in O(1) (the planner weighs thousands of ranges per plan)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate

from engine.placement.model import ModelSpec


@dataclass(frozen=True)
class Assumptions:
    """Figures the predictions rest on. The efficiencies and per-layer overheads are
    starting guesses for MLX on Apple GPUs, to be replaced by a short measurement on the
    real machine (see docs/placement.md)."""
    bandwidth_efficiency: float = 0.70  # share of peak memory bandwidth a decode step gets
    compute_efficiency: float = 0.50  # share of peak FLOP/s a prefill matmul gets
    layer_overhead_s: float = 25e-6  # kernel launches and syncs per dense layer, decode
    moe_layer_overhead_s: float = 120e-6  # routing, sorting and gathers per MoE layer
    act_bytes: int = 2  # activations and messages in bfloat16
    prefill_chunk: int = 2048  # mlx-lm's prefill_step_size
    prefill_tokens: int = 4096  # the prompt length prefill tokens/s is quoted for
    runtime_fixed_bytes: int = 1_000_000_000  # MLX, Metal and the worker itself
    runtime_fraction: float = 0.02  # allocator slack on weights and cache
    # the prefix cache's budget: this many contexts' worth of KV kept for later requests
    # (the worker's budget in tokens is the same multiple of the context length)
    prefix_cache_contexts: float = 1.0
    streams: int = 16  # requests a node decodes together (shoal node --max-streams)
    # speculative decoding (a request alone): guesses per pass at most, and the share of
    # guesses kept, geometric (prompt lookup on agent traffic keeps most; free chat far fewer, and
    # there the node stops drafting, so a drafted prediction is never below the plain one)
    draft_tokens: int = 6
    draft_acceptance: float = 0.6
    # time to first token: the prompt lengths predicted, the share of each prompt the
    # prefix cache already holds (an agent's next turn: most of it), and the time a
    # prefill chunk is sized to while others decode and alone (engine/runtime/chunking.py)
    ttft_prompts: tuple[int, ...] = (1000, 10000, 50000)
    prompt_cached: float = 0.0
    chunk_busy_s: float = 0.1
    chunk_alone_s: float = 1.0


DEFAULT = Assumptions()


@dataclass(frozen=True)
class LayerTable:
    """Prefix sums over layers: x[e] - x[s] is the sum over layers s..e-1."""
    weights: tuple[float, ...]  # parameters stored
    active: tuple[float, ...]  # parameters read per token
    moe: tuple[int, ...]  # MoE layers
    replicated: tuple[float, ...] = (0.0,)  # parameters a tensor rank keeps whole

    def span(self, xs: tuple[float, ...] | tuple[int, ...], s: int, e: int) -> float:
        return xs[e] - xs[s]


@lru_cache(maxsize=64)
def table(model: ModelSpec) -> LayerTable:
    n = range(model.layers)
    return LayerTable(weights=(0.0, *accumulate(model.layer_params(i) for i in n)),
                      active=(0.0, *accumulate(model.layer_active_params(i) for i in n)),
                      moe=(0, *accumulate(int(model.is_moe(i)) for i in n)),
                      replicated=(0.0, *accumulate(model.layer_replicated_params(i)
                                                   for i in n)))


@lru_cache(maxsize=256)
def kv_tokens(model: ModelSpec, context: int) -> tuple[int, ...]:
    """Prefix sums of cached tokens per layer at this context (sliding windows cap it)."""
    return (0, *accumulate(model.layer_kv_tokens(i, context) for i in range(model.layers)))
