"""Checkpoint folders as the Hub ships them, from the tiny configs of tests/real_configs.py:
random weights through mlx-lm's own model class, then written in the checkpoint's own
format: plain, MLX-quantized (`quantization` with per-layer overrides), FP8 blocks with
`weight_scale_inv` (DeepSeek, Kimi K2, MiniMax originals), gpt-oss's MXFP4 blocks,
compressed-tensors int4 (Kimi K2.5) or ModelOpt NVFP4, in the original repos' tensor
names where those differ from MLX's. Wrappers carry a vision tensor as real ones do.
`shards` > 1 splits the weights over files with a model.safetensors.index.json."""

from __future__ import annotations

import fnmatch
import json
import re
import struct
from pathlib import Path
from typing import Any

from real_configs import published, shrink
from tiny import SPECIALS, write_byte_tokenizer

QUANT_BLOCKS = ("quantization", "quantization_config")
# A vision tensor per wrapper, named as the original checkpoints name them: sanitize()
# drops them, and their "layers.N" must not look like a text layer to a pipeline rank.
VISION = {"gemma3": "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight",
          "mistral3": "vision_tower.transformer.layers.0.feed_forward.gate_proj.weight",
          "ministral3": "vision_tower.transformer.layers.0.feed_forward.gate_proj.weight",
          "qwen3_5": "model.visual.blocks.0.mlp.linear_fc1.weight",
          "qwen3_5_moe": "model.visual.blocks.0.mlp.linear_fc1.weight",
          "kimi_k25": "vision_tower.encoder.blocks.0.mlp.fc0.weight"}


def quant_kind(config: dict[str, Any]) -> str:
    """"mlx", "fp8", "mxfp4", "compressed-tensors", "modelopt" or "none"."""
    if isinstance(config.get("quantization"), dict):
        return "mlx"
    q = config.get("quantization_config") or \
        (config.get("text_config") or {}).get("quantization_config")
    return str(q.get("quant_method")) if isinstance(q, dict) else "none"


def write_checkpoint(folder: Path, name: str, seed: int = 0, shards: int = 1) -> Path:
    """Write the tiny version of reference config `name` into `folder`."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    folder.mkdir(parents=True, exist_ok=True)
    tokens = write_byte_tokenizer(folder)
    config = shrink(published(name), vocab=-(-tokens // 8) * 8)
    plain = {k: v for k, v in config.items() if k not in QUANT_BLOCKS}
    if isinstance(plain.get("text_config"), dict):
        plain["text_config"] = {k: v for k, v in plain["text_config"].items()
                                if k not in QUANT_BLOCKS}
    model_cls, args_cls = _get_classes(plain)
    mx.random.seed(seed)
    try:
        model = model_cls(args_cls.from_dict(plain))
        prefix = ""
    except TypeError:  # mlx-lm reads this wrapper's type as a text model: build the text
        text_only = plain["text_config"]  # part, named as the wrapper's repo names it
        model_cls, args_cls = _get_classes(text_only)
        model = model_cls(args_cls.from_dict(text_only))
        prefix = "language_model."
    weights = dict(tree_flatten(model.parameters()))
    _pin_end_of_turn(weights, tokens)
    text = config.get("text_config") or config
    if "bfloat16" in (config.get("torch_dtype"), config.get("dtype"), text.get("dtype")):
        weights = {k: v.astype(mx.bfloat16) if mx.issubdtype(v.dtype, mx.floating) else v
                   for k, v in weights.items()}  # as published: bfloat16 tensors
    model.load_weights(list(weights.items()))
    weights = {prefix + k: v for k, v in weights.items()}
    kind = quant_kind(config)
    if kind == "mlx":
        weights = _mlx_quantized(model, weights, config["quantization"])
    elif kind == "fp8":
        q = config["quantization_config"]
        weights = _fp8_blocks(_hf_experts(weights, text), q.get("modules_to_not_convert"),
                              ue8m0=q.get("scale_fmt") == "ue8m0")
    elif kind == "mxfp4":
        weights = _gpt_oss_mxfp4(weights)
    elif kind == "compressed-tensors":
        q = text["quantization_config"]
        weights = _int4_packed(_hf_experts(weights, text), q["ignore"])
    elif kind == "modelopt":
        weights = _nvfp4(_hf_experts(weights, text), config["quantization_config"]["ignore"])
    if config.get("model_type") in VISION:
        weights[VISION[str(config["model_type"])]] = mx.zeros((8, 8), mx.bfloat16)
    _save(folder, weights, shards)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def _pin_end_of_turn(weights: dict[str, Any], tokens: int) -> None:
    """The end-of-turn row of the head (and the padding rows) give logit 0, so greedy
    decoding runs as long as asked (as tests/tiny.py does)."""
    import mlx.core as mx

    head = next((k for k in weights if k.endswith("lm_head.weight")), None) or \
        next(k for k in weights if k.endswith("embed_tokens.weight"))
    eos = SPECIALS.index("<|im_end|>") + tokens - len(SPECIALS)
    w = weights[head]
    rows = mx.arange(w.shape[0])
    weights[head] = w * ((rows != eos) & (rows < tokens))[:, None]


def _mlx_quantized(model: Any, weights: dict[str, Any], q: dict[str, Any]) -> dict[str, Any]:
    """As mlx_lm.convert writes them: every layer whose input width divides by the group,
    with the per-layer overrides the block names."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    model.load_weights(list(weights.items()))
    group = int(q["group_size"])

    def pick(path: str, m: Any) -> Any:
        if isinstance(q.get(path), dict):
            return q[path]
        return hasattr(m, "to_quantized") and m.weight.shape[-1] % group == 0

    nn.quantize(model, group_size=group, bits=int(q["bits"]), mode=q.get("mode", "affine"),
                class_predicate=pick)
    return dict(tree_flatten(model.parameters()))


def _hf_experts(weights: dict[str, Any], text: dict[str, Any]) -> dict[str, Any]:
    """The original repos' names: experts one by one (MLX stacks them in switch_mlp), and
    DeepSeek's kv_b_proj (MLX splits it into embed_q / unembed_out)."""
    import mlx.core as mx

    out: dict[str, Any] = {}
    minimax = "block_sparse_moe" in "".join(weights)
    names = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"} if minimax else {}
    for k, v in weights.items():
        m = re.match(r"(.*)\.switch_mlp\.(gate_proj|up_proj|down_proj)\.weight$", k)
        if m:
            for e in range(v.shape[0]):
                out[f"{m[1]}.experts.{e}.{names.get(m[2], m[2])}.weight"] = v[e]
        elif k.endswith(".embed_q.weight"):
            base = k[: -len("embed_q.weight")]
            wk, wv = v, weights[base + "unembed_out.weight"]  # (h, kv, nope), (h, v, kv)
            kv_b = mx.concatenate([wk.swapaxes(-1, -2), wv], axis=1)
            out[base + "kv_b_proj.weight"] = kv_b.reshape(-1, kv_b.shape[-1])
        elif not k.endswith(".unembed_out.weight"):
            out[k] = v
    return out


def _linear(k: str, v: Any) -> bool:
    return v.ndim == 2 and bool(re.search(r"(proj|proj_with_mqa|\.w[123])\.weight$", k))


def _ignored(k: str, patterns: list[str] | None) -> bool:
    """compressed-tensors / ModelOpt / FP8 skip lists: names, globs or "re:" patterns."""
    module = k.rsplit(".", 1)[0]
    for p in patterns or []:
        if p.startswith("re:"):
            if re.match(p[3:], module):
                return True
        elif fnmatch.fnmatch(module, p) or module == p or module.endswith("." + p):
            return True
    return False


def _fp8_blocks(weights: dict[str, Any], skip: list[str] | None, ue8m0: bool
                ) -> dict[str, Any]:
    """Every projection as float8 e4m3 in 128x128 blocks with its weight_scale_inv."""
    import mlx.core as mx

    out: dict[str, Any] = {}
    for k, v in weights.items():
        if not _linear(k, v) or _ignored(k, skip):
            out[k] = v.astype(mx.bfloat16)
            continue
        m, n = v.shape
        pm, pn = -m % 128, -n % 128
        blocks = mx.pad(v.astype(mx.float32), ((0, pm), (0, pn)))
        blocks = blocks.reshape((m + pm) // 128, 128, (n + pn) // 128, 128)
        scale = mx.maximum(mx.abs(blocks).max(axis=(1, 3)), 1e-8) / 448.0
        if ue8m0:  # scales are powers of two
            scale = mx.power(2.0, mx.ceil(mx.log2(scale)))
        q = (blocks / scale[:, None, :, None]).reshape(m + pm, n + pn)[:m, :n]
        out[k] = ("F8_E4M3", mx.to_fp8(q))
        out[k.replace(".weight", ".weight_scale_inv")] = scale.astype(mx.float32)
    return out


def _gpt_oss_mxfp4(weights: dict[str, Any]) -> dict[str, Any]:
    """gpt-oss's experts as its repo has them: gate and up interleaved row by row in
    gate_up_proj, MXFP4 blocks of 32 (16 bytes) with one uint8 scale each."""
    import mlx.core as mx

    out: dict[str, Any] = {}

    def interleave(a: Any, b: Any, axis: int) -> Any:
        s = mx.stack([a, b], axis=axis + 1)
        shape = list(a.shape)
        shape[axis] *= 2
        return s.reshape(shape)

    def blocks(w: Any) -> tuple[Any, Any]:
        wq, scales = mx.quantize(w, group_size=32, bits=4, mode="mxfp4")
        return wq.view(mx.uint8).reshape(*w.shape[:-1], w.shape[-1] // 32, 16), scales

    for k, v in weights.items():
        if ".experts.gate_proj.weight" in k:
            up = weights[k.replace("gate_proj", "up_proj")]
            b, s = blocks(interleave(v, up, 1))
            base = k.replace("gate_proj.weight", "gate_up_proj")
            out[base + "_blocks"], out[base + "_scales"] = b, s
        elif ".experts.gate_proj.bias" in k:
            up = weights[k.replace("gate_proj", "up_proj")]
            out[k.replace("gate_proj.bias", "gate_up_proj_bias")] = interleave(v, up, 1)
        elif ".experts.down_proj.weight" in k:
            b, s = blocks(v)
            base = k.replace("down_proj.weight", "down_proj")
            out[base + "_blocks"], out[base + "_scales"] = b, s
        elif ".experts.down_proj.bias" in k:
            out[k.replace("down_proj.bias", "down_proj_bias")] = v
        elif ".experts.up_proj." not in k:
            out[k] = v.astype(mx.bfloat16)
    return out


def _int4_packed(weights: dict[str, Any], ignore: list[str]) -> dict[str, Any]:
    """compressed-tensors "pack-quantized": symmetric int4 in groups of 32, eight values
    per int32 (lowest bits first), w = (q - 8) * scale."""
    import mlx.core as mx

    out: dict[str, Any] = {}
    for k, v in weights.items():
        plain = k.replace("language_model.", "", 1)
        if not _linear(k, v) or _ignored(plain, ignore) or _ignored(k, ignore):
            out[k] = v.astype(mx.bfloat16)
            continue
        m, n = v.shape
        g = v.astype(mx.float32).reshape(m, n // 32, 32)
        scale = mx.maximum(mx.abs(g).max(axis=-1), 1e-8) / 7.0
        q = mx.clip(mx.round(g / scale[..., None]) + 8, 0, 15).astype(mx.uint32)
        q = q.reshape(m, n // 8, 8)
        words = sum(q[..., i] << (4 * i) for i in range(8))
        base = k[: -len("weight")]
        out[base + "weight_packed"] = words.astype(mx.uint32).view(mx.int32)
        out[base + "weight_scale"] = scale.astype(mx.bfloat16)
        out[base + "weight_shape"] = mx.array([m, n], mx.int32)
    return out


def _nvfp4(weights: dict[str, Any], ignore: list[str]) -> dict[str, Any]:
    """ModelOpt NVFP4: two e2m1 values per byte, an e4m3 scale per 16, a global scale."""
    import mlx.core as mx

    out: dict[str, Any] = {}
    for k, v in weights.items():
        if not _linear(k, v) or _ignored(k, ignore):
            out[k] = v.astype(mx.bfloat16)
            continue
        wq, scales = mx.quantize(v, group_size=16, bits=4, mode="nvfp4")
        out[k] = wq.view(mx.uint8)
        out[k.replace(".weight", ".weight_scale")] = ("F8_E4M3", scales)
        out[k.replace(".weight", ".weight_scale_2")] = mx.array(1.0, mx.float32)
        out[k.replace(".weight", ".input_scale")] = mx.array(1.0, mx.float32)
    return out


def _save(folder: Path, weights: dict[str, Any], shards: int) -> None:
    """safetensors files (an index when more than one); ("F8_E4M3", uint8 array) entries
    are written with that dtype in the header, as PyTorch writes float8."""
    import mlx.core as mx

    def order(k: str) -> tuple[int, str]:  # by layer, as exporters write shards
        m = re.search(r"(?:^|\.)layers\.(\d+)\.", k)
        return (int(m[1]) + 1 if m and "vision" not in k and "visual" not in k else
                (0 if "embed" in k else 1 << 20), k)
    keys = sorted(weights, key=order)
    size = -(-len(keys) // shards)
    parts = [keys[i * size:(i + 1) * size] for i in range(shards)]
    names = ["model.safetensors"] if shards == 1 else \
        [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    index: dict[str, str] = {}
    for fname, part in zip(names, parts):
        arrays = {k: (weights[k][1] if isinstance(weights[k], tuple) else weights[k])
                  for k in part}
        mx.save_safetensors(str(folder / fname), arrays)
        fp8 = [k for k in part if isinstance(weights[k], tuple)]
        if fp8:
            _retag(folder / fname, fp8, "F8_E4M3")
        index.update({k: fname for k in part})
    if shards > 1:
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": sum(_tensor_bytes(p) for p in folder.glob(
                "model-*.safetensors"))}, "weight_map": index}, indent=2))


def _tensor_bytes(path: Path) -> int:
    """What the Hub's index counts: the tensors' bytes, not the headers."""
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    return path.stat().st_size - 8 - n


def _retag(path: Path, keys: list[str], dtype: str) -> None:
    """Rewrite the header's dtype of `keys` (same item size, so offsets stay)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    for k in keys:
        header[k]["dtype"] = dtype
    new = json.dumps(header, separators=(",", ":")).encode()
    new += b" " * (-len(new) % 8)
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])
