"""Constrained decoding: a JSON schema enforced token by token.

llguidance was chosen over outlines-core and xgrammar: it installs from PyPI as one small
wheel (xgrammar pulls in torch), compiles schemas lazily instead of building a whole-vocabulary
automaton up front (outlines-core), and covers recursive JSON (`json_object`) and Lark. Its MLX
helper is a Metal kernel, so the mask is applied here with plain MLX ops that run on CPU too.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from engine.errors import BadRequest
from engine.protocol import Constraint


@functools.lru_cache(maxsize=4)
def _ll_tokenizer(tokenizer: Any) -> Any:
    """llguidance's view of the vocabulary (~1 s to build, so one per loaded tokenizer)."""
    import llguidance.hf

    hf = getattr(tokenizer, "_tokenizer", tokenizer)  # mlx-lm's wrapper holds the HF one
    eos = sorted(getattr(tokenizer, "eos_token_ids", None) or [hf.eos_token_id])
    return llguidance.hf.from_tokenizer(hf, eos_token=eos[0])


def grammar_for(constraint: Constraint) -> str:
    """llguidance grammar text for a constraint's JSON schema."""
    from llguidance import LLMatcher

    schema = constraint["json_schema"] or {"type": "object"}
    return LLMatcher.grammar_from_json_schema(json.dumps(schema),
                                              defaults={"whitespace_flexible": False})


def check_constraint(constraint: Constraint, tokenizer: Any,
                     param: str = "response_format") -> None:
    """BadRequest naming `param` when llguidance can't compile the grammar."""
    from llguidance import LLMatcher

    try:
        grammar = grammar_for(constraint)
    except ValueError as e:
        raise BadRequest(f"'{param}': the schema is not usable: {e}", param=param) from None
    err = LLMatcher.validate_grammar(grammar, _ll_tokenizer(tokenizer))
    if err:
        raise BadRequest(f"'{param}': the schema can't be enforced: {err}", param=param)


class GrammarProcessor:
    """An mlx-lm logits processor: every token but those the grammar allows next gets -inf.
    Once the grammar is complete only end-of-sequence is allowed."""

    def __init__(self, constraint: Constraint, tokenizer: Any):
        from llguidance import LLMatcher

        self._tok = _ll_tokenizer(tokenizer)
        self._matcher = LLMatcher(self._tok, grammar_for(constraint), log_level=0)
        if self._matcher.is_error():
            raise BadRequest(f"The output constraint can't be used: "
                             f"{self._matcher.get_error()}", param="response_format")
        self._eos = sorted(getattr(tokenizer, "eos_token_ids", None) or [])
        self._seen: int | None = None  # length of the token history at the last call

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx
        import numpy as np

        n = int(tokens.shape[-1]) if tokens is not None else 0
        if self._seen is not None and n > self._seen:  # the token sampled last step
            self._matcher.consume_token(int(tokens[-1].item()))
        self._seen = n
        vocab = logits.shape[-1]
        if self._matcher.is_error() or self._matcher.is_stopped():
            allowed = np.zeros(vocab, dtype=bool)
            allowed[[e for e in self._eos if e < vocab]] = True
        else:
            bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
            allowed = np.unpackbits(bits, bitorder="little")[:vocab].astype(bool)
            if allowed.size < vocab:
                allowed = np.concatenate([allowed, np.zeros(vocab - allowed.size, bool)])
            if self._matcher.is_accepting():
                allowed[[e for e in self._eos if e < vocab]] = True
        return mx.where(mx.array(allowed), logits, mx.array(-float("inf"), logits.dtype))
