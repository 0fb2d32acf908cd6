"""Constrained decoding: a JSON schema, a regular expression or a Lark grammar enforced
token by token.

llguidance was chosen over outlines-core and xgrammar: it installs from PyPI as one small
wheel (xgrammar pulls in torch), compiles schemas lazily instead of building a whole-vocabulary
automaton up front (outlines-core), and covers recursive JSON (`json_object`) and Lark. Its MLX
helper is a Metal kernel, so the mask is applied here with plain MLX ops that run on CPU too.

A grammar comes from a client, so it is bounded: its text's size here, its lexer's and
parser's work per step by llguidance's own limits (LIMITS), and its compiler, which recurses
once per rule in a chain of rules, runs on a thread with a stack deep enough for the
longest chain the size allows (54 KB of chained rules overflowed the main thread's 8 MB).
"""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from engine.errors import BadRequest
from engine.protocol import Constraint

MAX_GRAMMAR_CHARS = 64 * 1024  # a regex's or a Lark grammar's text (and GBNF's, choices')
MAX_SCHEMA_CHARS = 512 * 1024  # a JSON schema, as JSON (a forced call holds every tool's)
MAX_CHOICES = 4096
COMPILE_STACK = 256 << 20  # 64 KiB of chained rules (~8,000) need ~25 MB; reserved, not used
# llguidance's defaults, named: what one step of a grammar may cost
LIMITS: dict[str, Any] = {
    "max_items_in_row": 2000, "initial_lexer_fuel": 1_000_000, "step_lexer_fuel": 200_000,
    "step_max_items": 50_000, "max_lexer_states": 250_000, "max_grammar_size": 500_000,
    "verbose_errors": False}  # an error names the grammar, not the parser's state
T = TypeVar("T")
log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=4)
def _ll_tokenizer(tokenizer: Any) -> Any:
    """llguidance's view of the vocabulary (~1 s to build, so one per loaded tokenizer)."""
    import llguidance.hf

    hf = getattr(tokenizer, "_tokenizer", tokenizer)  # mlx-lm's wrapper holds the HF one
    eos = sorted(getattr(tokenizer, "eos_token_ids", None) or [hf.eos_token_id])
    return llguidance.hf.from_tokenizer(hf, eos_token=eos[0])


def _limits() -> Any:
    from llguidance import LLParserLimits

    return LLParserLimits(**LIMITS)


def _deep_stack(fn: Callable[[], T]) -> T:
    """fn() on a thread with COMPILE_STACK of stack (its exception re-raised here)."""
    out: list[Any] = []

    def work() -> None:
        try:
            out.append((True, fn()))
        except BaseException as e:  # handed to the caller's thread
            out.append((False, e))

    with _STACK_LOCK:  # stack_size() is process-wide: set it for this one thread
        try:
            old = threading.stack_size(COMPILE_STACK)
        except ValueError:  # a platform that refuses the size: its default, logged
            log.warning("can't give the grammar compiler a %d MB stack", COMPILE_STACK >> 20)
            old = threading.stack_size()
        try:
            t = threading.Thread(target=work, name="grammar-compile", daemon=True)
            t.start()
        finally:
            threading.stack_size(old)
    t.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


_STACK_LOCK = threading.Lock()


MAX_REPEAT = 10_000  # a{1000000} compiles lazily and fails only mid-answer: refuse it first
_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def _bounded(text: Any, what: str, most: int = MAX_GRAMMAR_CHARS) -> str:
    if not isinstance(text, str):
        raise ValueError(f"the {what} must be a string")
    if len(text) > most:
        raise ValueError(f"the {what} is {len(text):,} characters; at most {most:,} are "
                         "taken")
    for m in _REPEAT.finditer(text):
        count = max(int(m[1]), int(m[2] or 0))
        if count > MAX_REPEAT:
            raise ValueError(f"the {what} repeats {m[0]!r}: at most {MAX_REPEAT:,} "
                             "repetitions are taken")
    return text


def grammar_for(constraint: Constraint) -> str:
    """llguidance grammar text for a constraint: its JSON schema, regex or Lark grammar
    (exactly one). ValueError for one that is missing, too large or not JSON."""
    from llguidance import LLMatcher

    kinds = [k for k in ("json_schema", "regex", "lark") if k in constraint]
    if len(kinds) != 1:
        raise ValueError("a constraint is exactly one of a JSON schema, a regex or a Lark "
                         "grammar")
    if "regex" in constraint:
        return LLMatcher.grammar_from_regex(_bounded(constraint["regex"], "regex"))
    if "lark" in constraint:
        return LLMatcher.grammar_from_lark(_bounded(constraint["lark"], "grammar"))
    try:
        schema = json.dumps(constraint["json_schema"] or {"type": "object"})
    except (TypeError, ValueError, RecursionError) as e:
        raise ValueError(f"the schema is not JSON: {e}") from None
    _bounded(schema, "schema", MAX_SCHEMA_CHARS)
    return LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})


def matcher(constraint: Constraint, tokenizer: Any) -> Any:
    """A fresh llguidance matcher for the constraint (ValueError where grammar_for
    refuses it; a grammar llguidance can't use leaves the matcher in its error state).
    Compiled anew each time: copies of one matcher share its lexer, whose growth counts
    against LIMITS, so a grammar cached across requests would fail where it passed."""
    from llguidance import LLMatcher

    grammar, ll = grammar_for(constraint), _ll_tokenizer(tokenizer)
    return _deep_stack(lambda: LLMatcher(ll, grammar, log_level=0, limits=_limits()))


def check_constraint(constraint: Constraint, tokenizer: Any,
                     param: str = "response_format") -> None:
    """BadRequest naming the constraint's own field (its "param"), else `param`, when the
    grammar is too large, can't be compiled or is too complex for its first step."""
    param = constraint.get("param") or param
    what = "schema" if "json_schema" in constraint else \
        "regex" if "regex" in constraint else "grammar"
    try:
        m = matcher(constraint, tokenizer)
    except ValueError as e:
        raise BadRequest(f"'{param}': the {what} is not usable: {e}", param=param) from None
    if not m.is_error():
        m.compute_bitmask()  # a grammar too complex to parse shows here, not at compile
    if m.is_error():
        raise BadRequest(f"'{param}': the {what} can't be enforced: "
                         f"{_first_line(m.get_error())}", param=param)


def _first_line(error: str) -> str:
    return error.strip().split("\n<state>")[0].strip()[:2000]


def gbnf_to_lark_text(text: str) -> str:
    """A llama.cpp GBNF grammar as Lark (llguidance's converter; Lark passes through).
    ValueError that says what is wrong with it."""
    from llguidance.gbnf_to_lark import any_to_lark

    _bounded(text, "grammar")
    try:
        return any_to_lark(text)
    except RecursionError:
        raise ValueError("the grammar is nested too deeply") from None
    except Exception as e:  # the converter's own errors say where
        raise ValueError(f"the grammar is not GBNF llguidance can read: {e}") from None


def choice_grammar(choices: Sequence[str]) -> str:
    """A Lark grammar whose only answers are these exact strings. One terminal of
    alternatives, so the lexer, not the parser, tells them apart (a parser row of more
    than 2,000 alternatives is too complex for llguidance). ValueError for an empty
    list, a choice that isn't a string, or too many or too long."""
    if isinstance(choices, str) or not isinstance(choices, Sequence):
        raise ValueError("the choices must be a list of strings")
    if not choices:
        raise ValueError("the choices are empty: give at least one")
    if len(choices) > MAX_CHOICES:
        raise ValueError(f"{len(choices):,} choices; at most {MAX_CHOICES:,} are taken")
    for c in choices:
        if not isinstance(c, str):
            raise ValueError(f"every choice must be a string, not {c!r:.40}")
    # JSON's string escapes are Lark's (quotes, backslashes, control characters)
    lark = "start: CHOICE\nCHOICE: " + " | ".join(
        json.dumps(c, ensure_ascii=False) for c in dict.fromkeys(choices))
    return _bounded(lark, "list of choices")


class GrammarProcessor:
    """An mlx-lm logits processor: every token but those the grammar allows next gets -inf.
    Once the grammar is complete only end-of-sequence is allowed."""

    def __init__(self, constraint: Constraint, tokenizer: Any):
        param = constraint.get("param") or "response_format"
        try:
            self._matcher = matcher(constraint, tokenizer)
        except ValueError as e:
            raise BadRequest(f"'{param}': the output constraint can't be used: {e}",
                             param=param) from None
        if self._matcher.is_error():
            raise BadRequest(f"'{param}': the output constraint can't be used: "
                             f"{_first_line(self._matcher.get_error())}", param=param)
        self._eos = sorted(getattr(tokenizer, "eos_token_ids", None) or [])
        self._seen: int | None = None  # length of the token history at the last call
        self._told = False

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx
        import numpy as np

        n = int(tokens.shape[-1]) if tokens is not None else 0
        if self._seen is not None and n > self._seen:  # the token sampled last step
            self._matcher.consume_token(int(tokens[-1].item()))
        self._seen = n
        vocab = logits.shape[-1]
        if self._matcher.is_error() or self._matcher.is_stopped():
            if self._matcher.is_error() and not self._told:  # e.g. a step over LIMITS
                self._told = True
                log.warning("the output constraint failed mid-answer, which ends here: %s",
                            _first_line(self._matcher.get_error()))
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
