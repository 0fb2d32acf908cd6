"""Output constraints beyond JSON schemas: a regex or a Lark grammar (vLLM's guided_regex,
guided_grammar, guided_choice; llama.cpp's GBNF through llguidance's converter), each
enforced on a random tiny model (whose own output is noise, so a match comes from the
grammar), each refused with a 400 naming the field that sent it, and hostile ones
answered in bounded time without taking the worker down."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.errors import BadRequest
from engine.protocol import Delta, Done, GenerateRequest, SamplingRequest
from tiny import LLAMA, make_tiny_model


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("grammar") / "m", LLAMA)


@pytest.fixture(scope="module")
def tiny(folder):
    from engine.runtime.load import load_model

    model, tok, _ = load_model(folder)
    return model, tok


def answer(tiny, constraint, seed: int = 0, max_tokens: int = 40) -> tuple[str, Done]:
    from engine.runtime.generate import generate
    from engine.runtime.request import run

    model, tok = tiny
    out: list = []
    run("r", GenerateRequest(prompt="Answer:", sampling=SamplingRequest(
        constraint=constraint, temperature=1.0, seed=seed, max_tokens=max_tokens)),
        model, tok, 4096, generate, threading.Event(), out.append)
    return "".join(e.text for e in out if isinstance(e, Delta)), out[-1]


def check(tiny, constraint, param: str = "response_format") -> None:
    from engine.runtime.grammar import check_constraint

    check_constraint(constraint, tiny[1], param)


def refused(tiny, constraint, param: str = "response_format") -> BadRequest:
    with pytest.raises(BadRequest) as e:
        check(tiny, constraint, param)
    assert e.value.status == 400
    return e.value


# --- what each kind enforces ----------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_regex_is_matched_whole(tiny, seed):
    text, done = answer(tiny, {"regex": r"[0-9]{3}-[a-z]{2}( ok)?", "param": "guided_regex"},
                        seed)
    assert done.finish_reason == "stop" and re.fullmatch(r"[0-9]{3}-[a-z]{2}( ok)?", text)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_lark_grammar_is_matched_whole(tiny, seed):
    lark = 'start: item ("," item)*\nitem: /[a-c]/ | "(" start ")"'
    text, done = answer(tiny, {"lark": lark}, seed, max_tokens=200)
    if done.finish_reason == "stop":
        assert re.fullmatch(r"[a-c(),]+", text) and text.count("(") == text.count(")")
    else:  # cut by max_tokens: what there is still belongs to the language
        assert re.fullmatch(r"[a-c(),]*", text)


def test_choices_answer_exactly_one_of_them(tiny):
    from engine.runtime.grammar import choice_grammar

    choices = ['say "hi"', "back\\slash", "new\nline", "été", "no"]
    seen = set()
    for seed in range(6):
        text, done = answer(tiny, {"lark": choice_grammar(choices), "param": "guided_choice"},
                            seed)
        assert done.finish_reason == "stop" and text in choices
        seen.add(text)
    assert len(seen) > 1  # the grammar chose among them, not one fixed answer


def test_choice_grammar_escapes_every_choice_exactly(tiny):
    """Each choice is accepted as written, and nothing else: quotes, backslashes, control
    characters, non-ASCII, an empty string, and 4,096 choices (past llguidance's 2,000
    alternatives a parser row takes)."""
    from engine.runtime.grammar import choice_grammar, matcher

    tok = tiny[1]
    choices = ['a"b', "c\\d", "e\nf\tg", "日本", "", "x" * 300,
               *(f"choice {i}" for i in range(4090))]
    lark = choice_grammar(choices)
    for c in [*choices[:6], "choice 4089"]:
        m = matcher({"lark": lark}, tok)
        assert m.consume_tokens(tok.encode(c)) and m.is_accepting(), c
    for other in ['a\\"b', "c\\\\d", "choice 4090", "日"]:
        m = matcher({"lark": lark}, tok)
        assert not (m.consume_tokens(tok.encode(other)) and m.is_accepting()), other


@pytest.mark.parametrize("bad,says", [
    ([], "empty"), ("yes", "list"), (["a", 1], "string"), ([None], "string"),
    ([str(i) for i in range(4097)], "at most"), (["x" * 70_000], "at most")])
def test_choice_grammar_refuses_what_is_not_a_list_of_strings(bad, says):
    from engine.runtime.grammar import choice_grammar

    with pytest.raises(ValueError, match=says):
        choice_grammar(bad)


def test_gbnf_becomes_lark_that_is_enforced(tiny):
    from engine.runtime.grammar import gbnf_to_lark_text

    gbnf = 'root ::= answer "." \nanswer ::= "yes" | "no" | [0-9] [0-9]?'
    lark = gbnf_to_lark_text(gbnf)
    for seed in range(3):
        text, done = answer(tiny, {"lark": lark, "param": "grammar"}, seed)
        assert done.finish_reason == "stop" and re.fullmatch(r"(yes|no|[0-9]{1,2})\.", text)
    assert gbnf_to_lark_text('start: "x"') == 'start: "x"'  # Lark passes through


@pytest.mark.parametrize("bad,says", [
    ('root ::= "a', "end of input"), ('root ::= "a" | undefined_rule', "not found"),
    ("", "No 'root' rule"),
    ("root ::= " + "(" * 5000 + '"a"' + ")" * 5000, "nested too deeply"),
    ('root ::= "' + "a" * 70_000 + '"', "at most")])
def test_gbnf_that_cant_be_converted_is_a_value_error_that_says_why(bad, says):
    from engine.runtime.grammar import gbnf_to_lark_text

    with pytest.raises(ValueError, match=says):
        gbnf_to_lark_text(bad)


# --- the 400s -------------------------------------------------------------------------------
def test_a_bad_regex_or_grammar_is_a_400_naming_the_field_that_sent_it(tiny):
    e = refused(tiny, {"regex": "(abc", "param": "guided_regex"})
    assert e.param == "guided_regex" and "unclosed group" in e.message
    e = refused(tiny, {"lark": "start: undefined", "param": "grammar"})
    assert e.param == "grammar" and "undefined" in e.message and "<state>" not in e.message
    e = refused(tiny, {"json_schema": {"type": "nonsense"}}, "response_format")
    assert e.param == "response_format"


@pytest.mark.parametrize("constraint", [
    {"regex": "a" * (64 * 1024 + 1)}, {"lark": 'start: "' + "a" * 65_536 + '"'},
    {"json_schema": {"enum": ["x" * 1000] * 600}}, {}, {"regex": "a", "lark": 'start: "a"'},
    {"regex": 5}, {"regex": "a{1000000}"}, {"regex": "a{2,20001}"},  # fail mid-answer else
    {"lark": 'start: /a{0, 99999}/'}])
def test_oversized_or_malformed_constraints_are_a_400(tiny, constraint):
    e = refused(tiny, {**constraint, "param": "structured_outputs"})
    assert e.param == "structured_outputs"


def test_the_generation_path_names_the_field_too(tiny):
    from engine.runtime.grammar import GrammarProcessor

    with pytest.raises(BadRequest) as e:
        GrammarProcessor({"regex": "(abc", "param": "guided_regex"}, tiny[1])
    assert e.value.param == "guided_regex"


# --- hostile grammars: bounded time, no crash ------------------------------------------------
@pytest.mark.parametrize("constraint", [
    {"regex": "(a*)*b"},  # catastrophic backtracking for a backtracking engine
    {"regex": "(a|aa)*c"},
    {"regex": "|".join(f"word{i}" for i in range(9000))},  # a 64 KiB alternation
    {"regex": "a{10000}{10000}"},  # 10^8 repetitions: the lexer's fuel runs out
    {"regex": "(.*a){40}"},
    {"lark": "start: " + " | ".join(f'"w{i}"' for i in range(5000))},  # a 5,000-item row
    {"lark": 'start: s\ns: s s s | s s | "a" | ""'},  # ambiguous, empty loops
    {"json_schema": {"$defs": {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"},
                                                   {"type": "integer"}]}
                               for i in range(2000)} | {"d2000": {"type": "string"}},
                     "$ref": "#/$defs/d0"}}])
def test_a_hostile_grammar_is_refused_or_answered_in_bounded_time(tiny, constraint):
    t0 = time.monotonic()
    try:
        text, done = answer(tiny, constraint, max_tokens=20)
    except BadRequest as e:
        assert e.param == "response_format"
    else:
        assert isinstance(done, Done) and done.finish_reason in ("stop", "length")
    assert time.monotonic() - t0 < 30


def test_a_regex_like_a_star_star_b_still_means_what_it_says(tiny):
    for seed in range(3):
        text, done = answer(tiny, {"regex": "(a*)*b"}, seed, max_tokens=60)
        if done.finish_reason == "stop":
            assert re.fullmatch("a*b", text), text
        else:
            assert re.fullmatch("a*b?", text), text


CHAIN = """
import itertools, string, sys
from pathlib import Path
from engine.runtime.load import load_model
from engine.runtime.grammar import MAX_GRAMMAR_CHARS, check_constraint
_, tok, _ = load_model(Path(sys.argv[1]))
# the longest chain of rules the size allows: 'abc:abd' lines, ~8,000 of them
names = ["".join(p) for p in itertools.product(string.ascii_lowercase, repeat=3)]
n = (MAX_GRAMMAR_CHARS - 40) // 8
rules = "".join(f"{a}:{b}\\n" for a, b in zip(names[:n], names[1:n]))
lark = "start: " + names[0] + "\\n" + rules + names[n - 1] + ': "a"\\n'
assert len(lark) <= MAX_GRAMMAR_CHARS, len(lark)
check_constraint({"lark": lark}, tok)
print("served", n)
"""


def test_a_chain_of_rules_as_long_as_the_size_allows_does_not_crash_the_worker(folder):
    """llguidance's compiler recurses once per chained rule: 3,000 (54 KB) overflowed the
    main thread's 8 MB stack (SIGSEGV). In a process of its own, so a crash is a failure
    here, not the end of the test run."""
    r = subprocess.run([sys.executable, "-c", CHAIN, str(folder)],
                       capture_output=True, text=True, timeout=300,
                       cwd=str(Path(__file__).parents[3]))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("served")


def test_a_json_schema_nested_past_pythons_recursion_is_a_400(tiny):
    deep: dict = {"type": "string"}
    for _ in range(5000):
        deep = {"type": "array", "items": deep}
    e = refused(tiny, {"json_schema": deep, "param": "guided_json"})
    assert e.param == "guided_json"


def test_choices_through_json_dumps_round_trip_on_the_pipe():
    """The API sends a choice grammar as Lark text inside the request's JSON."""
    from engine.protocol import Generate, decode, encode
    from engine.runtime.grammar import choice_grammar

    c = {"lark": choice_grammar(["a", 'b"c']), "param": "guided_choice"}
    msg = Generate("x", GenerateRequest(prompt="p", sampling=SamplingRequest(constraint=c)))
    assert decode(encode(msg)).request.sampling.constraint == c
    assert json.loads(json.dumps(c)) == c
