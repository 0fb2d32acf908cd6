"""Build a Hugging Face tokenizer (tokenizer.json + tokenizer_config.json) from the
`tokenizer.*` metadata of a GGUF file, so mlx-lm's AutoTokenizer path loads it.

Two vocabulary kinds: "gpt2" (byte-level BPE with merges; the split regex comes from
`tokenizer.ggml.pre`) and "llama" (SentencePiece BPE with scores and byte fallback).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from engine.errors import CorruptModel, UnsupportedModel

log = logging.getLogger(__name__)

# llama.cpp token types (llama_token_type).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 2, 3, 4

_GPT2_DEFAULT = "gpt2"  # ByteLevel's built-in GPT-2 regex
_DIGITS_GPT2 = "digits+gpt2"  # StarCoder/SmolLM: every digit alone, then the GPT-2 regex
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# o200k (tiktoken's openai_public.py): Phi-4-mini and other GPT-4o-style vocabularies.
_GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
          r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
          r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
           r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# tokenizer.ggml.pre -> how llama.cpp splits text before BPE (its llama-vocab.cpp table).
PRE_TOKENIZERS: dict[str, str] = {
    "default": _GPT2_DEFAULT, "gpt-2": _GPT2_DEFAULT, "gpt2": _GPT2_DEFAULT,
    "phi-2": _GPT2_DEFAULT, "olmo": _GPT2_DEFAULT,
    "smollm": _DIGITS_GPT2, "starcoder": _DIGITS_GPT2, "refact": _DIGITS_GPT2,
    "codeshell": _DIGITS_GPT2, "command-r": _DIGITS_GPT2,
    "llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3, "smaug-bpe": _LLAMA3,
    "falcon3": _LLAMA3, "dbrx": _LLAMA3,  # llama-vocab.cpp: DBRX (Phi-4) splits as Llama 3
    "gpt-4o": _GPT4O,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2,
    "tekken": _TEKKEN,
}
# llama-vocab.cpp's end-of-generation token texts (special_eog_ids).
END_OF_GENERATION = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>"})
# llama.cpp tokenizes these whole words first when the word is in the vocabulary.
_IGNORE_MERGES = {"llama3", "llama-v3", "llama-bpe"}


@dataclass(frozen=True)
class BuiltTokenizer:
    tokenizer_json: str  # serialized tokenizers.Tokenizer
    config: dict[str, Any]  # tokenizer_config.json
    bos_token_id: int | None
    eos_token_ids: list[int]


def build_tokenizer(meta: dict[str, Any], file_name: str) -> BuiltTokenizer:
    """Build the tokenizer a GGUF file describes; UnsupportedModel for kinds Shoal lacks."""
    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise UnsupportedModel(f"{file_name} has no tokenizer vocabulary "
                               f"(tokenizer.ggml.tokens); Shoal needs one to run it.")
    types = meta.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise CorruptModel(f"{file_name} is corrupt: {len(tokens)} tokens but "
                           f"{len(types)} token types.")
    if kind == "gpt2":
        tok, add_bos_default = _byte_level_bpe(meta, tokens, file_name), False
    elif kind == "llama":
        tok, add_bos_default = _sentencepiece_bpe(meta, tokens, types, file_name), True
    else:
        raise UnsupportedModel(
            f"{file_name} uses tokenizer model {kind!r}; Shoal can import GGUF tokenizers "
            f"'gpt2' (byte-level BPE) and 'llama' (SentencePiece).")

    _add_special_tokens(tok, tokens, types)

    def token(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    bos_id = bos_id if isinstance(bos_id, int) and 0 <= bos_id < len(tokens) else None
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default)) and bos_id is not None
    _set_post_processor(tok, kind, tokens[bos_id] if add_bos and bos_id is not None else None,
                        bos_id)

    eos_ids = [meta[f"tokenizer.ggml.{k}_token_id"] for k in ("eos", "eot", "eom")
               if isinstance(meta.get(f"tokenizer.ggml.{k}_token_id"), int)]
    # As llama.cpp (so LM Studio and Ollama): these texts end generation wherever they
    # are in the vocabulary, e.g. Gemma's <end_of_turn> and Phi-3's <|end|>.
    eos_ids += [i for i, t in enumerate(tokens) if t in END_OF_GENERATION]
    eos_ids = list(dict.fromkeys(i for i in eos_ids if 0 <= i < len(tokens)))
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos"), "eos_token": token("eos"),
        "unk_token": token("unknown"), "pad_token": token("padding"),
        "add_bos_token": add_bos, "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
    }
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str) and template.strip():
        config["chat_template"] = template
    context = meta.get(f"{meta.get('general.architecture')}.context_length")
    if isinstance(context, int):
        config["model_max_length"] = context
    config = {k: v for k, v in config.items() if v is not None}
    return BuiltTokenizer(tok.to_str(), config, bos_id, eos_ids)


def _byte_level_bpe(meta: dict[str, Any], tokens: list[str], file_name: str) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = meta.get("tokenizer.ggml.pre") or "default"
    split = PRE_TOKENIZERS.get(pre)
    if split is None:
        raise UnsupportedModel(
            f"{file_name} splits text with the {pre!r} pre-tokenizer, which Shoal does not "
            f"know; it can import {', '.join(sorted(PRE_TOKENIZERS))}.")
    merges_raw = meta.get("tokenizer.ggml.merges")
    if not isinstance(merges_raw, list):
        raise CorruptModel(f"{file_name} has a byte-level BPE vocabulary without merges "
                           f"(tokenizer.ggml.merges).")
    merges = []
    for m in merges_raw:
        left, sep, right = m.partition(" ")
        if not sep:
            raise CorruptModel(f"{file_name} is corrupt: merge {m!r} is not 'left right'.")
        merges.append((left, right))
    vocab = {t: i for i, t in enumerate(tokens)}
    model = models.BPE(vocab, merges, ignore_merges=pre in _IGNORE_MERGES)
    tok = Tokenizer(model)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if split == _GPT2_DEFAULT:
        tok.pre_tokenizer = byte_level
    elif split == _DIGITS_GPT2:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(meta: dict[str, Any], tokens: list[str], types: list[int],
                       file_name: str) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers

    scores = meta.get("tokenizer.ggml.scores")
    if not isinstance(scores, list) or len(scores) != len(tokens):
        raise CorruptModel(f"{file_name} has a SentencePiece vocabulary without one score "
                           f"per token (tokenizer.ggml.scores).")
    vocab = {t: i for i, t in enumerate(tokens)}
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    if not isinstance(unk_id, int):
        unk_id = next((i for i, ty in enumerate(types) if ty == TOKEN_UNKNOWN), None)
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    # Only normal pieces take part in merges; control/byte pieces are never merged into.
    mergeable = {t: s for t, s, ty in zip(tokens, scores, types) if ty == TOKEN_NORMAL}
    tok = Tokenizer(models.BPE(vocab, _merges_from_scores(vocab, mergeable), unk_token=unk,
                               fuse_unk=True, byte_fallback=True))
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    # Like llama.cpp (and SentencePiece): a space before every text run, even one that
    # starts with spaces, then spaces become "▁". Metaspace would skip the first case.
    steps = [normalizers.Replace(" ", "▁")]
    tok.normalizer = normalizers.Sequence(
        ([normalizers.Prepend("▁")] if prefix else []) + steps)
    # mlx-lm recognises exactly these decoder chains and picks its SPM streaming detokenizer.
    chain = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        chain.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(chain)
    return tok


def _merges_from_scores(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """SentencePiece BPE merges the pair whose result scores best; rebuild that order."""
    ranked: list[tuple[float, int, int, str, str]] = []
    for piece, score in scores.items():
        for i in range(1, len(piece)):
            left, right = piece[:i], piece[i:]
            if left in vocab and right in vocab:
                ranked.append((-score, vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _add_special_tokens(tok: Any, tokens: list[str], types: list[int]) -> None:
    from tokenizers import AddedToken

    special = [AddedToken(t, special=True, normalized=False)
               for t, ty in zip(tokens, types) if ty == TOKEN_CONTROL]
    user = [AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, types) if ty == TOKEN_USER_DEFINED]
    if special:
        tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)


def _set_post_processor(tok: Any, kind: str, bos: str | None, bos_id: int | None) -> None:
    from tokenizers import processors

    steps: list[Any] = []
    if kind == "gpt2":
        steps.append(processors.ByteLevel(trim_offsets=False))
    if bos is not None and bos_id is not None:
        steps.append(processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, bos_id)]))
    if len(steps) == 1:
        tok.post_processor = steps[0]
    elif steps:
        tok.post_processor = processors.Sequence(steps)
