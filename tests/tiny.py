"""Tiny random-weight models for fast, exact tests: a real mlx-lm model class, real
safetensors, and a byte-level tokenizer with a ChatML template (no downloads)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 4,
         "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
         "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 4096,
         "tie_word_embeddings": False}
QWEN3 = {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 4,
         "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
         "max_position_embeddings": 4096, "tie_word_embeddings": False}


def write_byte_tokenizer(folder: Path) -> int:
    """A byte-level BPE tokenizer with no merges (one token per byte) plus ChatML specials.
    Returns the vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHATML,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "unk_token": None, "model_max_length": 4096, "clean_up_tokenization_spaces": False}))
    return tok.get_vocab_size()


def make_tiny_model(folder: Path, arch: dict[str, Any] = LLAMA, seed: int = 0,
                    **overrides: Any) -> Path:
    """Write a random-weight model folder that mlx_lm.load() accepts.

    The end-of-turn token's output row is zero, so its logit is exactly 0 while some other
    logit is almost surely positive: greedy decoding never stops early, which keeps the
    streaming tests' generations as long as they ask for."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes as get_model_classes

    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_byte_tokenizer(folder)
    config = {**arch, "vocab_size": vocab, **overrides}
    model_cls, args_cls = get_model_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    eos = SPECIALS.index("<|im_end|>") + len(weights["model.embed_tokens.weight"]) - len(SPECIALS)
    head = weights["lm_head.weight"]
    weights["lm_head.weight"] = head * (mx.arange(head.shape[0]) != eos)[:, None]
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder
