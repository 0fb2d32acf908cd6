"""Each token's piece for llama.cpp's /tokenize with_pieces: text where the token's bytes
are UTF-8 alone, else the bytes, which join back into the text (a byte-level vocabulary:
'媽' and '🤗' are split between tokens)."""

from __future__ import annotations

from pathlib import Path

from engine.runtime.pieces import pieces
from tiny import write_byte_tokenizer

TEXT = "This is a test string with unicode 媽 and emoji 🤗<|im_end|>"


def test_pieces_join_back_into_the_text(tmp_path: Path):
    from mlx_lm.tokenizer_utils import load

    write_byte_tokenizer(tmp_path)
    tok = load(tmp_path)
    ids = tok.encode(TEXT, add_special_tokens=False)
    got = pieces(tok, ids)
    assert len(got) == len(ids)
    assert got[0] == "T" and got[-1] == "<|im_end|>"  # a special token is one piece
    split = [p for p in got if isinstance(p, list)]
    assert len(split) == len("媽".encode()) + len("🤗".encode())
    assert all(len(p) == 1 and 0x80 <= p[0] <= 0xFF for p in split)
    joined = b"".join(p.encode() if isinstance(p, str) else bytes(p) for p in got)
    assert joined == TEXT.encode()
