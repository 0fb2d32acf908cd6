"""Memory one rank needs: its weights, the KV cache for the whole requested context, the
prefix cache kept for later requests, the transient activations of a prefill chunk, and
runtime overhead. Checked against what the
GPU may use, never against "free" memory."""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine.placement.model import ModelSpec, NodeSpec
from engine.placement.tables import DEFAULT, Assumptions, kv_tokens, table


@dataclass(frozen=True)
class MemoryUse:
    """Bytes one rank needs, by kind, and what its node can give."""
    weights: int
    kv_cache: int
    activations: int
    overhead: int
    usable: int
    prefix_cache: int = 0
    draft: int = 0  # a draft model's weights and KV, on the rank that drafts (rank 0)

    @property
    def total(self) -> int:
        return (self.weights + self.kv_cache + self.prefix_cache + self.activations
                + self.overhead + self.draft)

    @property
    def fits(self) -> bool:
        return self.total <= self.usable


def gb(n: float) -> str:
    """Decimal gigabytes, as model sizes are quoted."""
    return f"{n / 1e9:.1f} GB"


def context_label(context: int) -> str:
    return f"{context // 1024}k" if context % 1024 == 0 else f"{context} tokens"


def layers_label(layers: tuple[int, int]) -> str:
    s, e = layers
    return f"layer {s}" if e - s == 1 else f"layers {s}-{e - 1}"


def refusal(node: NodeSpec, use: MemoryUse, layers: tuple[int, int], context: int,
            tensor_ranks: int = 0) -> str:
    """The message a user sees when a rank doesn't fit, with the numbers."""
    what = f"1/{tensor_ranks} of every layer" if tensor_ranks > 1 else layers_label(layers)
    return (f"node {node.name} needs {gb(use.total)} for {what} at "
            f"{context_label(context)} context; {gb(use.usable)} usable "
            f"(weights {gb(use.weights)}, KV cache {gb(use.kv_cache)}, prefix cache "
            f"{gb(use.prefix_cache)}, activations "
            f"{gb(use.activations)}, runtime {gb(use.overhead)}"
            + (f", draft model {gb(use.draft)}" if use.draft else "") + ")")


class Sizer:
    """Memory of ranks of one model at one context. Built once per plan: the split's
    binary searches weigh thousands of ranges."""

    def __init__(self, model: ModelSpec, context: int, a: Assumptions = DEFAULT):
        self.model, self.context, self.a = model, context, a
        self._t = table(model)
        self._kv = kv_tokens(model, context)
        self._kv_bytes = model.kv_per_token * model.kv_bytes
        self._act = _activations(model, context, model.heads, a)

    def pipeline(self, node: NodeSpec, layers: tuple[int, int], first: bool,
                 last: bool) -> MemoryUse:
        """A pipeline rank holding layers [s, e): the embeddings and the output head come
        with the first rank, which runs the head for the last rank's output (`last` is
        kept so callers read alike; it adds nothing)."""
        weights, kv = self._pipeline_parts(layers, first, last)
        use = _use(weights, kv, self._act, node, self.a)
        return replace(use, draft=self._draft(node, first, last))

    def pipeline_fits(self, node: NodeSpec, s: int, e: int, first: bool, last: bool) -> bool:
        weights, kv = self._pipeline_parts((s, e), first, last)
        a = self.a  # the same sum, rounded the same way, as MemoryUse.total
        prefix = kv * a.prefix_cache_contexts
        need = round(weights) + round(kv) + round(prefix) + round(self._act) + \
            round(a.runtime_fixed_bytes + a.runtime_fraction * (weights + kv + prefix)) + \
            self._draft(node, first, last)
        return need <= node.memory_bytes

    def _draft(self, node: NodeSpec, first: bool, last: bool = True) -> int:
        """A node's draft model is loaded by rank 0, which drafts for the whole group."""
        if not first or not node.draft_bytes:
            return 0
        return round(node.draft_bytes + node.draft_kv_per_token * self.context)

    def _pipeline_parts(self, layers: tuple[int, int], first: bool,
                        last: bool) -> tuple[float, float]:
        s, e = layers
        m = self.model
        params = self._t.weights[e] - self._t.weights[s]
        if first:
            params += m.embed_params + (0 if m.tie_embeddings else m.head_params)
        return params * m.bytes_per_param, (self._kv[e] - self._kv[s]) * self._kv_bytes

    def tensor(self, node: NodeSpec, ranks: int, first: bool = False) -> MemoryUse:
        """A tensor rank: 1/ranks of every layer but what shard() keeps whole (MLA's
        down-projections, routers); embeddings and head are replicated (mlx-lm shards
        only the layers); the KV cache splits by head, except MLA's shared
        latent."""
        m = self.model
        rep = self._t.replicated[-1] if ranks > 1 else 0.0  # kept whole on every rank
        params = (self._t.weights[-1] - rep) / ranks + rep + m.edge_params
        kv = self._kv[-1] * self._kv_bytes / (ranks if m.kv_sharded else 1)
        use = _use(params * m.bytes_per_param, kv,
                   _activations(m, self.context, m.heads // ranks, self.a), node, self.a)
        return replace(use, draft=self._draft(node, first))


def pipeline_rank_memory(model: ModelSpec, node: NodeSpec, layers: tuple[int, int],
                         first: bool, last: bool, context: int,
                         a: Assumptions = DEFAULT) -> MemoryUse:
    """Memory of one pipeline rank (see Sizer.pipeline)."""
    return Sizer(model, context, a).pipeline(node, layers, first, last)


def tensor_rank_memory(model: ModelSpec, node: NodeSpec, ranks: int, context: int,
                       a: Assumptions = DEFAULT, first: bool = False) -> MemoryUse:
    """Memory of one of `ranks` tensor-parallel ranks (see Sizer.tensor)."""
    return Sizer(model, context, a).tensor(node, ranks, first)


def _activations(model: ModelSpec, context: int, heads: int, a: Assumptions) -> float:
    chunk = min(a.prefill_chunk, context)
    ffn = max(model.intermediate if model.dense_layers or not model.experts else 0,
              (model.active_experts + model.shared_experts) * model.moe_intermediate)
    out = chunk * a.act_bytes * (4 * model.hidden + 3 * ffn)
    if not model.kv_sharded:
        # mlx-lm's MLA prefill materialises the rope scores (chunk x heads x context) and
        # expands the latent cache into per-head keys and values.
        out += a.act_bytes * heads * context * (chunk + 2 * model.head_dim)
    return out


def _use(weights: float, kv: float, act: float, node: NodeSpec, a: Assumptions) -> MemoryUse:
    prefix = kv * a.prefix_cache_contexts
    overhead = a.runtime_fixed_bytes + a.runtime_fraction * (weights + kv + prefix)
    return MemoryUse(weights=round(weights), kv_cache=round(kv), activations=round(act),
                     overhead=round(overhead), usable=int(node.memory_bytes),
                     prefix_cache=round(prefix))
