"""Small builders for the placement tests: nodes, links and models by numbers."""

from __future__ import annotations

from engine.placement.model import LinkSpec, ModelSpec, NodeSpec

GB = 1e9


def node(name: str, usable_gb: float, bandwidth_gbs: float = 800, tflops: float = 28,
         files: bool = False, rdma: bool = False) -> NodeSpec:
    return NodeSpec(name, name, int(usable_gb * GB), bandwidth_gbs * GB, tflops * 1e12,
                    files, rdma)


def mesh(nodes: list[NodeSpec], latency_us: float = 300, gbit: float = 80,
         rdma_latency_us: float | None = None) -> list[LinkSpec]:
    """A TCP link between every pair, plus an RDMA one when rdma_latency_us is given."""
    out = []
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            out.append(LinkSpec(a.id, b.id, latency_us * 1e-6, gbit * 1e9 / 8))
            if rdma_latency_us is not None:
                out.append(LinkSpec(a.id, b.id, rdma_latency_us * 1e-6, gbit * 1e9 / 8, True))
    return out


def dense(layers: int = 80, bpp: float = 0.5625, **kw) -> ModelSpec:
    """Llama-3.3-70B's shape (about 40 GB at 4-bit)."""
    args = dict(name="llama-70b", layers=layers, hidden=8192, heads=64, kv_heads=8,
                head_dim=128, intermediate=28672, vocab=128256, bytes_per_param=bpp,
                model_type="llama")
    return ModelSpec(**{**args, **kw})


LLAMA_CONFIG = {"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
                "num_attention_heads": 64, "num_key_value_heads": 8,
                "num_hidden_layers": 80, "vocab_size": 128256,
                "tie_word_embeddings": False, "max_position_embeddings": 131072}
