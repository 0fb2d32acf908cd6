"""Tiny random-weight vision checkpoints from real published configs: each family's vision
config kept, sizes shrunk so an image is a few tokens; written the way mlx-community ships
them (mlx-vlm's own tensor names, safetensors), with a byte-level tokenizer that has the
family's image tokens, a chat template that takes content lists, and the image
processor's preprocessor_config.json. Both mlx-vlm's load() and Shoal's loader read them."""

from __future__ import annotations

import base64
import copy
import hashlib
import io
import json
from pathlib import Path
from typing import Any

LOCAL = Path(__file__).resolve().parent / "fixtures" / "model-configs"  # the published ones

GEMMA3_SPECIALS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>",
                   "<start_of_image>", "<end_of_image>", "<image_soft_token>"]
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] | trim }}{% else %}"
    "{% for p in m['content'] %}{% if p['type'] == 'image' %}<start_of_image>"
    "{% elif p['type'] == 'text' %}{{ p['text'] | trim }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n"
    "{% endif %}")
IMAGE_SIZE, PATCH = 56, 14  # 4 x 4 patches, pooled to 2 x 2 = 4 image tokens


def published(name: str) -> dict[str, Any]:
    return json.loads((LOCAL / f"{name}.json").read_text())


def write_tokenizer(folder: Path, specials: list[str], template: str,
                    extra: dict[str, Any]) -> dict[str, int]:
    """Specials first (so <pad> is id 0, as Gemma's is), then one token per byte."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = {s: i for i, s in enumerate(specials)}
    for ch in sorted(ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template,
        "model_max_length": 4096, "clean_up_tokenization_spaces": False, **extra}))
    return vocab


TINY = {"text": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, num_hidden_layers=6,
                     sliding_window=8, query_pre_attn_scalar=16),
        "vision": dict(hidden_size=32, intermediate_size=64, num_attention_heads=2,
                       num_hidden_layers=2, image_size=IMAGE_SIZE, patch_size=PATCH),
        "image_tokens": 4}
# a bigger shrink for benchmarks: 256 patches an image pooled to 64 tokens
SMALL = {"text": dict(hidden_size=512, intermediate_size=1024, num_attention_heads=8,
                      num_key_value_heads=4, head_dim=64, num_hidden_layers=6,
                      sliding_window=512, query_pre_attn_scalar=64),
         "vision": dict(hidden_size=384, intermediate_size=1536, num_attention_heads=6,
                        num_hidden_layers=6, image_size=224, patch_size=14),
         "image_tokens": 64}


def gemma3_config(vocab: dict[str, int], sizes: dict[str, Any] = TINY) -> dict[str, Any]:
    c = copy.deepcopy(published("google__gemma-3-27b-it"))
    t, v = c["text_config"], c["vision_config"]
    t.update(**sizes["text"], vocab_size=len(vocab))
    v.update(**sizes["vision"])
    n = sizes["image_tokens"]
    c.update(mm_tokens_per_image=n, vocab_size=len(vocab), pad_token_id=0,
             image_token_index=vocab["<image_soft_token>"],
             boi_token_index=vocab["<start_of_image>"],
             eoi_token_index=vocab["<end_of_image>"],
             eos_token_id=[vocab["<eos>"], vocab["<end_of_turn>"]])
    t["mm_tokens_per_image"] = n
    return c


def make_tiny_gemma3(folder: Path, seed: int = 0, sizes: dict[str, Any] = TINY) -> Path:
    """A Gemma 3 vision checkpoint: SigLIP tower, the pooling projector, 4 tokens an image."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(folder, GEMMA3_SPECIALS, GEMMA3_TEMPLATE, {
        "bos_token": "<bos>", "eos_token": "<end_of_turn>", "pad_token": "<pad>",
        "extra_special_tokens": {"image_token": "<image_soft_token>",
                                 "boi_token": "<start_of_image>",
                                 "eoi_token": "<end_of_image>"}})
    config = gemma3_config(vocab, sizes)
    side, n = sizes["vision"]["image_size"], sizes["image_tokens"]
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor",
        "do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None,
        "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5], "image_seq_length": n, "resample": 2,
        "rescale_factor": 1 / 255, "size": {"height": side, "width": side}}))
    (folder / "processor_config.json").write_text(json.dumps({
        "image_seq_length": n, "processor_class": "Gemma3Processor"}))
    ends = config["eos_token_id"]
    _write_weights(folder, config, seed, lambda w: _zero_rows(
        w, "language_model.model.embed_tokens.weight", ends))
    return folder


def _zero_rows(weights: dict[str, Any], name: str, rows: list[int]) -> None:
    """End-of-turn logits exactly 0 (tied embeddings): greedy answers run their length."""
    import mlx.core as mx

    w = weights[name]
    keep = mx.ones((w.shape[0],))
    for r in rows:
        keep = keep * (mx.arange(w.shape[0]) != r)
    weights[name] = w * keep[:, None].astype(w.dtype)


def _write_weights(folder: Path, config: dict[str, Any], seed: int, fix: Any) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.utils import get_model_and_args, update_module_configs

    arch, _ = get_model_and_args(config)
    cfg = copy.deepcopy(config)
    mc = arch.ModelConfig.from_dict(cfg)
    mc = update_module_configs(mc, arch, cfg, ["text", "vision", "projector"])
    mx.random.seed(seed)
    model = arch.Model(mc)
    weights = dict(tree_flatten(model.parameters()))
    # mlx-vlm's ones-initialised projector would make every image look alike
    for k, w in weights.items():
        if "multi_modal_projector" in k or "norm" in k:
            weights[k] = w + 0.1 * mx.random.normal(w.shape).astype(w.dtype)
    if config.get("model_type") == "gemma3":  # tied embeddings, as Gemma 3 ships
        weights.pop("language_model.lm_head.weight", None)
    fix(weights)
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(config, indent=1))


def png(width: int, height: int, seed: int = 0) -> bytes:
    """A random RGB PNG."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG")
    return buf.getvalue()


def image_input(data: bytes) -> dict[str, Any]:
    """protocol.ImageInput for a PNG, as the API hands it on."""
    import numpy as np
    from PIL import Image

    im = Image.open(io.BytesIO(data)).convert("RGB")
    digest = hashlib.sha256(f"{im.width}x{im.height}".encode() +
                            np.asarray(im).tobytes()).hexdigest()
    return {"data": base64.b64encode(data).decode(), "sha256": digest,
            "width": im.width, "height": im.height}


MISTRAL3_SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]",
                     "[IMG_END]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"]
MISTRAL3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST]"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}[IMG]{% elif p['type'] == 'text' %}{{ p['text'] }}"
    "{% endif %}{% endfor %}{% endif %}[/INST]{% elif m['role'] == 'system' %}"
    "[SYSTEM_PROMPT]{{ m['content'] }}[/SYSTEM_PROMPT]{% else %}{{ m['content'] }}"
    "{{ eos_token }}{% endif %}{% endfor %}")


def make_tiny_mistral3(folder: Path, seed: int = 0) -> Path:
    """A Mistral Small 3.1 checkpoint: a Pixtral tower (2-D RoPE over the patches, any
    aspect ratio), the patch merger, [IMG] per merged patch with [IMG_BREAK] per row."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(folder, MISTRAL3_SPECIALS, MISTRAL3_TEMPLATE, {
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})
    c = copy.deepcopy(published("mistralai__Mistral-Small-3.1-24B-Instruct-2503"))
    c["text_config"].update(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=16, num_hidden_layers=4,
                            vocab_size=len(vocab))
    c["vision_config"].update(hidden_size=32, intermediate_size=64, num_attention_heads=2,
                              head_dim=16, num_hidden_layers=2, image_size=IMAGE_SIZE,
                              patch_size=PATCH)
    c.update(image_token_index=vocab["[IMG]"], vocab_size=len(vocab),
             eos_token_id=vocab["</s>"], bos_token_id=vocab["<s>"])
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "PixtralImageProcessor", "do_convert_rgb": True,
        "do_normalize": True, "do_rescale": True, "do_resize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "patch_size": {"height": PATCH, "width": PATCH}, "resample": 3,
        "rescale_factor": 1 / 255, "size": {"longest_edge": IMAGE_SIZE}}))
    (folder / "processor_config.json").write_text(json.dumps({
        "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]",
        "image_token": "[IMG]", "patch_size": PATCH, "processor_class": "PixtralProcessor",
        "spatial_merge_size": 2}))
    eos = vocab["</s>"]
    _write_weights(folder, c, seed, lambda w: _zero_rows(
        w, "language_model.lm_head.weight", [eos]))
    return folder


QWEN_CONFIGS = Path(__file__).resolve().parent / "fixtures" / "vision-configs"
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|image_pad|>", "<|video_pad|>", "<|vision_pad|>"]
QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}"
    "{{ m['content'] }}{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif p['type'] == 'text' %}"
    "{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
QWEN_TEXT = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=2, num_hidden_layers=4, max_position_embeddings=4096)


def _qwen_files(folder: Path, processor: str, image_processor: str) -> dict[str, int]:
    """Tokenizer (Qwen's specials, byte-level), and an image processor that makes a small
    picture 4 to 16 merged patches (min 56 x 56, max 112 x 112 pixels)."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(folder, QWEN_SPECIALS, QWEN_TEMPLATE, {
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None})
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": image_processor, "processor_class": processor,
        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711], "merge_size": 2,
        "min_pixels": 56 * 56, "max_pixels": 112 * 112, "patch_size": PATCH,
        "resample": 3, "rescale_factor": 1 / 255, "temporal_patch_size": 2}))
    return vocab


def _qwen_ids(c: dict[str, Any], vocab: dict[str, int]) -> None:
    c.update(image_token_id=vocab["<|image_pad|>"], video_token_id=vocab["<|video_pad|>"],
             vision_start_token_id=vocab["<|vision_start|>"],
             vision_end_token_id=vocab["<|vision_end|>"],
             vision_token_id=vocab["<|vision_pad|>"], bos_token_id=vocab["<|endoftext|>"],
             eos_token_id=vocab["<|im_end|>"], vocab_size=len(vocab))


def make_tiny_qwen25vl(folder: Path, seed: int = 0) -> Path:
    """Qwen2.5-VL: the windowed ViT with full attention in its last block of each window
    group, the 2 x 2 patch merger, M-RoPE (chunked sections) in the language model."""
    vocab = _qwen_files(folder, "Qwen2_5_VLProcessor", "Qwen2VLImageProcessor")
    c = copy.deepcopy(json.loads((QWEN_CONFIGS / "Qwen__Qwen2.5-VL-7B-Instruct.json")
                                 .read_text()))
    text = dict(QWEN_TEXT, rope_scaling={"mrope_section": [2, 3, 3], "rope_type": "default",
                                         "type": "default"})
    for t in (c, c["text_config"]):  # mlx-vlm reads the top level, mlx-lm text_config
        t.update(**text)
        _qwen_ids(t, vocab)
    c["text_config"]["layer_types"] = ["full_attention"] * text["num_hidden_layers"]
    c["vision_config"].update(depth=4, hidden_size=32, intermediate_size=64, num_heads=2,
                              out_hidden_size=text["hidden_size"],
                              fullatt_block_indexes=[1, 3])
    ends = [vocab["<|im_end|>"], vocab["<|endoftext|>"]]
    _write_weights(folder, c, seed, lambda w: _sharpen(w, ends))
    return folder


def make_tiny_qwen3vl(folder: Path, seed: int = 0, dense: bool = False) -> Path:
    """Qwen3-VL (the MoE one published): the ViT with learned position embeddings and
    deepstack (features of three vision blocks added to the first language layers'
    hidden states), M-RoPE with interleaved sections. `dense`: the same with a dense
    language model (model_type qwen3_vl, as Qwen3-VL-8B), its MoE fields dropped."""
    vocab = _qwen_files(folder, "Qwen3VLProcessor", "Qwen3VLImageProcessor")
    (folder / "preprocessor_config.json").write_text(json.dumps({
        **json.loads((folder / "preprocessor_config.json").read_text()),
        "patch_size": 16, "min_pixels": 64 * 64, "max_pixels": 128 * 128,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}))
    c = copy.deepcopy(json.loads((QWEN_CONFIGS / "Qwen__Qwen3-VL-235B-A22B-Thinking.json")
                                 .read_text()))
    _qwen_ids(c, vocab)
    c["text_config"].update(**QWEN_TEXT, head_dim=32, num_experts=4, num_experts_per_tok=2,
                            moe_intermediate_size=32, vocab_size=len(vocab),
                            rope_scaling={"mrope_interleaved": True,
                                          "mrope_section": [6, 5, 5], "rope_type": "default"})
    c["vision_config"].update(depth=3, hidden_size=32, intermediate_size=64, num_heads=2,
                              patch_size=16, out_hidden_size=64, num_position_embeddings=64,
                              deepstack_visual_indexes=[0, 1, 2])
    if dense:
        c.update(model_type="qwen3_vl", architectures=["Qwen3VLForConditionalGeneration"])
        c["vision_config"]["model_type"] = "qwen3_vl"
        for k in ("decoder_sparse_step", "mlp_only_layers", "moe_intermediate_size",
                  "norm_topk_prob", "num_experts", "num_experts_per_tok"):
            c["text_config"].pop(k, None)
        c["text_config"]["model_type"] = "qwen3_vl_text"
    ends = [vocab["<|im_end|>"], vocab["<|endoftext|>"]]
    _write_weights(folder, c, seed, lambda w: _sharpen(w, ends))
    return folder


def _sharpen(weights: dict[str, Any], ends: list[int]) -> None:
    """The language model's projections x3: at mlx's default init a model this small
    answers one token over and over, which positions could never change."""
    for k, w in weights.items():
        if k.startswith("language_model.") and any(
                p in k for p in ("proj", "lm_head", "experts", "mlp")):
            weights[k] = w * 3
    _zero_rows(weights, "language_model.lm_head.weight", ends)


def make_tiny_qwen35(folder: Path, seed: int = 0) -> Path:
    """Qwen3.5 (the 35B-A3B MoE published): Qwen3-VL's tower without deepstack beside a
    hybrid language model (three Gated DeltaNet layers to one attention layer, M-RoPE on
    a quarter of the head)."""
    vocab = _qwen_files(folder, "Qwen3VLProcessor", "Qwen3VLImageProcessor")
    (folder / "preprocessor_config.json").write_text(json.dumps({
        **json.loads((folder / "preprocessor_config.json").read_text()),
        "patch_size": 16, "min_pixels": 64 * 64, "max_pixels": 128 * 128,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}))
    c = published("Qwen__Qwen3.5-35B-A3B")
    _qwen_ids(c, vocab)
    c.pop("bos_token_id", None)
    t = c["text_config"]
    t.update(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             num_hidden_layers=4, layer_types=t["layer_types"][:4], linear_key_head_dim=16,
             linear_num_key_heads=2, linear_num_value_heads=4, linear_value_head_dim=16,
             num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
             shared_expert_intermediate_size=32, vocab_size=len(vocab),
             eos_token_id=vocab["<|im_end|>"], max_position_embeddings=4096)
    t["rope_parameters"] = {**t["rope_parameters"], "mrope_section": [3, 3, 2]}
    c["vision_config"].update(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                              out_hidden_size=64, num_position_embeddings=64)
    ends = [vocab["<|im_end|>"], vocab["<|endoftext|>"]]
    _write_weights(folder, c, seed, lambda w: _sharpen(w, ends))
    return folder
