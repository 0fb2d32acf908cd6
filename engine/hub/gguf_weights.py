"""Decode a GGUF file's tensors into mlx-lm's names and write them as safetensors shards,
one shard at a time, so an import needs memory for one shard, not for the whole model.

Sizes, the quantization block of config.json and the per-type report all come from the
plan (tensor infos and types), before any tensor is decoded.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import CorruptModel
from engine.hub.gguf_arch import ArchSpec, layer_part
from engine.hub.gguf_quants import GROUP_SIZE, HANDLING, Quantized, decode, dequantize, stored_bits
from engine.hub.gguf_reader import GGUFHeader, TensorInfo

if TYPE_CHECKING:
    import mlx.core as mx

FLOATS = ("F32", "F16", "BF16")
_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}


@dataclass(frozen=True)
class Planned:
    """One GGUF tensor and the mlx-lm parameter it becomes."""
    tensor: TensorInfo
    target: str  # e.g. model.layers.0.self_attn.q_proj.weight

    @property
    def bits(self) -> int | None:
        """Bits of its MLX affine layout; None when stored as floats (1-D tensors always)."""
        t = self.tensor
        return stored_bits(t.type_name) if len(t.shape) > 1 else None

    @property
    def nbytes(self) -> int:
        t, n = self.tensor, self.tensor.n_elements
        if self.bits is None:
            return n * _ITEMSIZE.get(t.type_name, 4)  # quantized 1-D: float32
        return n * self.bits // 8 + 2 * 4 * (n // GROUP_SIZE)  # + float32 scales, biases

    @property
    def stored_as(self) -> tuple[str, bool]:
        t = self.tensor
        if len(t.shape) == 1 and t.type_name not in FLOATS:
            return "float32 (dequantized)", True
        return HANDLING[t.type_name].stored_as, HANDLING[t.type_name].exact


def quantization(plan: list[Planned]) -> dict[str, Any] | None:
    """mlx-lm's quantization block: the most common bit width as the default and a
    per-layer entry for layers that differ (Q6_K's 8 bits next to Q4_K's 4)."""
    bits_of = {p.target.rpartition(".")[0]: p.bits for p in plan if p.bits is not None}
    if not bits_of:
        return None
    default = Counter(bits_of.values()).most_common(1)[0][0]
    quant: dict[str, Any] = {"group_size": GROUP_SIZE, "bits": default}
    for layer, bits in sorted(bits_of.items()):
        if bits != default:
            quant[layer] = {"group_size": GROUP_SIZE, "bits": bits}
    return quant


def report(plan: list[Planned]) -> list[dict[str, Any]]:
    """Per GGUF type: how many tensors, what they became, whether exactly."""
    counts = Counter((p.tensor.type_name, *p.stored_as) for p in plan)
    return [{"gguf_type": k[0], "tensors": n, "stored_as": k[1], "exact": k[2]}
            for k, n in sorted(counts.items())]


def save_weights(folder: Path, header: GGUFHeader, spec: ArchSpec, config: dict[str, Any],
                 plan: list[Planned], max_shard_bytes: int) -> None:
    """Decode and write the planned tensors as model.safetensors, or as numbered shards
    with model.safetensors.index.json, each shard decoded only when it is written."""
    import mlx.core as mx
    import numpy as np

    try:
        data = np.memmap(header.path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise CorruptModel(f"Could not read the tensors of {header.path.name}: {e}") from e
    shards: list[list[Planned]] = [[]]
    size = 0
    for p in sorted(plan, key=lambda p: p.target):
        if shards[-1] and size + p.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(p)
        size += p.nbytes
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, 1):
        file = ("model.safetensors" if len(shards) == 1
                else f"model-{i:05d}-of-{len(shards):05d}.safetensors")
        arrays: dict[str, mx.array] = {}
        for p in shard:
            arrays.update(_decode(data, header, spec, config, p))
        mx.save_safetensors(str(folder / file), arrays, metadata={"format": "mlx"})
        weight_map.update({k: file for k in arrays})
        del arrays  # free this shard before decoding the next
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(p.nbytes for p in plan)},
                 "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(
            json.dumps(index, indent=2) + "\n", encoding="utf-8")


def _decode(data: Any, header: GGUFHeader, spec: ArchSpec, config: dict[str, Any],
            p: Planned) -> dict[str, mx.array]:
    import mlx.core as mx
    import numpy as np

    t = p.tensor
    start = header.data_offset + t.offset
    raw = data[start:start + (t.nbytes or 0)]
    if spec.norm_shift and t.name.endswith("norm.weight"):
        value: Any = dequantize(raw, t.type_name, t.shape) - np.float32(spec.norm_shift)
    elif p.bits is None and t.type_name not in FLOATS:
        value = dequantize(raw, t.type_name, t.shape)  # a quantized 1-D tensor: tiny
    else:
        value = decode(raw, t.type_name, t.shape)
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    part = layer_part(t.name)
    if spec.permute_qk and part in heads:
        # llama.cpp permuted Q/K rows for its interleaved RoPE; undoing it on rows
        # alone is exact for quantized weights, scales and biases alike.
        value = _unpermute(value, heads[part], header.path.name, t.name)
    if isinstance(value, Quantized):
        base = p.target.rpartition(".")[0]
        return {p.target: mx.array(value.weight), f"{base}.scales": mx.array(value.scales),
                f"{base}.biases": mx.array(value.biases)}
    if t.type_name == "BF16" and value.dtype == np.uint16:
        return {p.target: mx.array(value).view(mx.bfloat16)}
    return {p.target: mx.array(value)}


def _unpermute(value: Any, n_head: int, file: str, tensor: str) -> Any:
    if isinstance(value, Quantized):
        return Quantized(_unpermute(value.weight, n_head, file, tensor),
                         _unpermute(value.scales, n_head, file, tensor),
                         _unpermute(value.biases, n_head, file, tensor), value.bits)
    if value.shape[0] % (2 * n_head):
        raise CorruptModel(f"{file}: {tensor} has {value.shape[0]} rows, which {n_head} "
                           f"attention heads can't split.")
    rows, rest = value.shape[0], tuple(value.shape[1:])
    # Inverse of convert_hf_to_gguf's permute() along axis 0.
    return (value.reshape(n_head, rows // n_head // 2, 2, *rest).swapaxes(1, 2)
            .reshape(rows, *rest))
