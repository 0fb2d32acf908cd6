"""vLLM's and llama.cpp's fields on the OpenAI routes, body -> GenerateRequest, without a
node: what each honoured field sets, the 400 naming each one that can't be honoured, the
hints logged, and hostile values bounded. (tests/engine/api/test_dialects.py checks the
answers through a real node.)"""

from __future__ import annotations

import json

import pytest

from engine.api import openai_chat, openai_completions
from engine.api.common import parse
from engine.api.dialect_map import SAMPLER_LETTERS, SAMPLER_NAMES
from engine.api.dialect_render import legacy_prompt, vllm_prompt_logprobs
from engine.api.openai_completions import CompletionRenderer, CompletionRequest
from engine.api.openai_schemas import ChatCompletionRequest
from engine.api.render import Context, logprobs_json
from engine.errors import BadRequest
from engine.protocol import SAMPLERS, Done
from engine.records import TokenLogprob, TopLogprob

MSGS = [{"role": "user", "content": "hi"}]


def chat(**kw):
    return openai_chat.to_request(parse(ChatCompletionRequest, {"messages": MSGS, **kw}))


def cmpl(**kw):
    return openai_completions.to_request(parse(CompletionRequest, {"prompt": "hi", **kw}))


def refused(fn, param: str, **kw) -> str:
    with pytest.raises(BadRequest) as e:
        fn(**kw)
    assert e.value.param == param, (e.value.param, e.value.message)
    return e.value.message


@pytest.mark.parametrize("fn", [chat, cmpl])
def test_vllm_sampling_fields_reach_the_sampler(fn):
    s = fn(ignore_eos=True, min_tokens=3, stop_token_ids=[5, 6],
           include_stop_str_in_output=True, skip_special_tokens=False,
           spaces_between_special_tokens=False, bad_words=["foo"], allowed_token_ids=[1, 2],
           truncate_prompt_tokens=7, prompt_logprobs=2).sampling
    assert (s.ignore_eos, s.min_tokens, s.stop_token_ids, s.include_stop) == \
        (True, 3, (5, 6), True)
    assert (s.skip_special, s.spaces_between_special, s.bad_words) == (False, False, ("foo",))
    assert (s.allowed_token_ids, s.truncate_prompt_tokens, s.prompt_logprobs) == \
        ((1, 2), 7, 2)
    assert fn().sampling.skip_special is True  # unset: the defaults


@pytest.mark.parametrize("fn", [chat, cmpl])
def test_llama_cpp_fields_reach_the_sampler(fn):
    s = fn(n_predict=9, typical_p=0.5, min_keep=2, samplers=["top_k", "typ_p", "temperature"],
           repeat_penalty=1.3, repeat_last_n=32, xtc_probability=0.5, xtc_threshold=0.2,
           mirostat=0, dry_multiplier=0, dynatemp_range=0, cache_prompt=True).sampling
    assert (s.max_tokens, s.typical_p, s.min_keep) == (9, 0.5, 2)
    assert s.samplers == ("top_k", "typical_p", "temperature")
    assert (s.repetition_penalty, s.repetition_context) == (1.3, 32)
    assert (s.xtc_probability, s.xtc_threshold) == (0.5, 0.2)
    assert fn(n_predict=-1).sampling.max_tokens is None
    assert fn(repeat_last_n=-1).sampling.repetition_context == 1_000_000
    off = fn(repeat_last_n=0, repeat_penalty=1.5, presence_penalty=1.0).sampling
    assert (off.repetition_penalty, off.presence_penalty) == (None, None)  # as llama.cpp


def test_llama_cpp_samplers_as_the_webui_sends_them():
    # llama.cpp's web UI sends its default chain as letters: penalties, DRY (off), ...
    assert chat(samplers="edkypmxt").sampling.samplers == \
        ("top_k", "typical_p", "top_p", "min_p", "xtc", "temperature")
    # and its server's default chain by name (common/common.h), top_n_sigma off
    assert chat(samplers=["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p",
                          "min_p", "xtc", "temperature"], top_n_sigma=-1).sampling.samplers \
        == ("top_k", "typical_p", "top_p", "min_p", "xtc", "temperature")
    assert set(SAMPLER_NAMES.values()) - {"penalties", "dry", "top_n_sigma", "infill",
                                          "adaptive_p"} == set(SAMPLERS)
    assert set(SAMPLER_LETTERS.values()) <= set(SAMPLER_NAMES.values())
    refused(chat, "dry_multiplier", samplers="dk", dry_multiplier=0.5)  # DRY on: a 400
    for bad in (["dry"], ["top_k", "penalties"], ["infill"], "kz", ["top_k", "top_k"],
                ["mirostat"], []):
        refused(chat, "samplers", samplers=bad)
    assert chat(samplers=["top_n_sigma", "top_k"]).sampling.samplers == ("top_k",)


def test_llama_cpps_seed_minus_1_is_a_random_seed():
    assert chat(seed=-1).sampling.seed is None and chat(seed=7).sampling.seed == 7


def test_n_predict_and_max_tokens_must_agree():
    assert cmpl(max_tokens=5, n_predict=5).sampling.max_tokens == 5
    refused(cmpl, "n_predict", max_tokens=5, n_predict=6)
    refused(chat, "repeat_penalty", repetition_penalty=1.1, repeat_penalty=1.2)
    refused(chat, "n_predict", n_predict=0)
    assert cmpl(n_predict=0).sampling.max_tokens == 0


@pytest.mark.parametrize("field,value", [
    ("mirostat", 2), ("dry_multiplier", 0.8), ("dynatemp_range", 0.5), ("n_indent", 4),
    ("t_max_predict_ms", 100), ("post_sampling_probs", True), ("use_beam_search", True),
    ("top_n_sigma", 1.5), ("n_cmpl", 2), ("reasoning_format", "none"),
    ("structural_tag", "{}"), ("guided_whitespace_pattern", " *"),
    ("logits_processors", ["os.system"]), ("return_token_ids", True),
    ("lora", [{"id": 0, "scale": 1.0}])])
def test_fields_that_cant_be_honoured_are_a_400_naming_them(field, value):
    for fn in (chat, cmpl):
        refused(fn, field, **{field: value})


def test_chat_template_is_refused_and_its_kwargs_reach_the_template():
    msg = refused(chat, "chat_template", chat_template="{{ messages }}")
    assert "chat_template_kwargs" in msg
    req = chat(chat_template_kwargs={"enable_thinking": False, "reasoning_effort": "low"})
    assert req.thinking is False and req.template_kwargs == {"reasoning_effort": "low"}
    # apply_chat_template's own arguments can't be smuggled in as template variables
    for key in ("chat_template", "tokenize", "tools", "add_generation_prompt"):
        refused(chat, f"chat_template_kwargs.{key}", chat_template_kwargs={key: "x"})
    refused(chat, "chat_template_kwargs", chat_template_kwargs={"not a name": 1})


def test_prompt_embeds_are_refused_on_completions():
    refused(cmpl, "prompt_embeds", prompt_embeds="AAAA")


def test_continue_final_message_and_documents():
    msgs = MSGS + [{"role": "assistant", "content": "The answer is"}]
    req = chat(messages=msgs, continue_final_message=True, add_generation_prompt=False,
               documents=[{"title": "a", "text": "b"}])
    assert req.continue_final and not req.add_generation_prompt
    assert req.documents == [{"title": "a", "text": "b"}]
    assert not chat(messages=msgs, continue_final_message=True).add_generation_prompt
    assert chat().add_generation_prompt and not chat(add_generation_prompt=False) \
        .add_generation_prompt
    refused(chat, "continue_final_message", messages=msgs, continue_final_message=True,
            add_generation_prompt=True)
    refused(chat, "add_special_tokens", add_special_tokens=True)
    assert cmpl(add_special_tokens=False).add_special is False


@pytest.mark.parametrize("fn", [chat, cmpl])
def test_structured_output_fields_are_one_llguidance_constraint(fn):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    cases = {"guided_json": (schema, {"json_schema": schema}),
             "json_schema": (schema, {"json_schema": schema}),
             "guided_regex": ("[ab]+", {"regex": "[ab]+"}),
             "guided_choice": (["yes", 'no "way"'],
                               {"lark": 'start: "yes" | "no \\"way\\""'})}
    for field, (value, want) in cases.items():
        assert fn(**{field: value}).sampling.constraint == {**want, "param": field}
    assert fn(guided_json=json.dumps(schema)).sampling.constraint["json_schema"] == schema
    assert fn(grammar="").sampling.constraint is None  # llama.cpp's "no grammar"
    lark = fn(grammar='root ::= "yes" | "no"').sampling.constraint
    assert lark["param"] == "grammar" and 'start: "yes"' in lark["lark"]
    assert fn(guided_grammar='start: "a"').sampling.constraint["lark"] == 'start: "a"'
    so = fn(structured_outputs={"choice": ["a", "b"]}).sampling.constraint
    assert so == {"lark": 'start: "a" | "b"', "param": "structured_outputs.choice"}
    assert fn(structured_outputs={"json_object": True}).sampling.constraint == \
        {"json_schema": {"type": "object"}, "param": "structured_outputs.json_object"}
    assert fn(response_format={"type": "json_object"}).sampling.constraint["param"] == \
        "response_format"
    refused(fn, "guided_regex", guided_json=schema, guided_regex="a")
    refused(fn, "guided_choice", response_format={"type": "json_object"},
            guided_choice=["a"])
    refused(fn, "grammar", grammar="root ::= (((")
    refused(fn, "guided_json", guided_json="{not json")
    refused(fn, "structured_outputs", structured_outputs={"regex": "a", "choice": ["b"]})
    refused(fn, "structured_outputs.structural_tag",
            structured_outputs={"structural_tag": "{}"})


@pytest.mark.parametrize("fn", [chat, cmpl])
def test_the_llama_cpp_web_uis_no_limit_and_typ_p(fn):
    """Both llama.cpp web UIs send max_tokens -1 for no limit; the current one sends the
    typical-p setting as typ_p."""
    assert fn(max_tokens=-1).sampling.max_tokens is None
    assert fn(max_tokens=-1, n_predict=-1).sampling.max_tokens is None
    assert fn(typ_p=0.5).sampling.typical_p == 0.5
    assert fn(typ_p=0.5, typical_p=0.5).sampling.typical_p == 0.5
    refused(fn, "typ_p", typ_p=0.5, typical_p=0.7)
    refused(fn, "max_tokens", max_tokens=-2)


def test_hints_are_logged_not_used():
    body = parse(ChatCompletionRequest, {"messages": MSGS, "priority": 3, "request_id": "r",
                                         "cache_salt": "s", "cache_prompt": True,
                                         "id_slot": 0, "mirostat_tau": 5.0,
                                         "guided_decoding_backend": "xgrammar",
                                         "ignore_eos": True, "structured_outputs": {
                                             "regex": "a", "disable_fallback": True}})
    assert set(body.hints()) == {"priority", "request_id", "cache_salt", "cache_prompt",
                                 "id_slot", "mirostat_tau", "guided_decoding_backend",
                                 "structured_outputs.disable_fallback"}
    t = ChatCompletionRequest.TREATMENT
    assert t["chat_template"] == "refused" and t["mirostat"].startswith("only 0")
    assert "ignore_eos" not in t  # honoured
    assert set(t) <= set(ChatCompletionRequest.model_fields)
    assert set(CompletionRequest.TREATMENT) <= set(CompletionRequest.model_fields)


@pytest.mark.parametrize("field,value", [
    ("stop_token_ids", [-1]), ("stop_token_ids", [2**40]), ("stop_token_ids", [1] * 2000),
    ("allowed_token_ids", []), ("allowed_token_ids", [0] * 300_000),
    ("bad_words", [""]), ("bad_words", ["x" * 300]), ("min_tokens", 10**9),
    ("prompt_logprobs", 21), ("prompt_logprobs", -1), ("guided_choice", []),
    ("guided_regex", "a" * 200_000), ("samplers", ["x" * 40]), ("samplers", "k" * 40),
    ("n_probs", 100), ("repeat_last_n", -2), ("mirostat", 3), ("typical_p", 0),
    ("truncate_prompt_tokens", 0), ("priority", 2**40), ("request_id", "r" * 1000),
    ("documents", [{}] * 300), ("dry_sequence_breakers", ["a"] * 100)])
def test_hostile_values_are_a_400_naming_the_field(field, value):
    with pytest.raises(BadRequest) as e:
        parse(ChatCompletionRequest, {"messages": MSGS, field: value})
    assert e.value.param is not None and e.value.param.startswith(field)


def test_completions_echo_with_logprobs_asks_for_the_prompts():
    req = cmpl(echo=True, logprobs=2, max_tokens=0)
    assert (req.sampling.max_tokens, req.sampling.logprobs, req.sampling.prompt_logprobs) \
        == (0, 2, 2)
    assert cmpl(echo=True).sampling.prompt_logprobs is None
    assert cmpl(n_probs=3).sampling.logprobs == 3
    refused(cmpl, "n_probs", logprobs=2, n_probs=3)


def _lp(token: str, lp: float, i: int, top=()) -> TokenLogprob:
    return TokenLogprob(token, lp, list(token.encode()),
                        [TopLogprob(t, x, list(t.encode()), id=j) for t, x, j in top], id=i)


def test_the_prompts_logprobs_in_the_legacy_and_vllm_shapes():
    plps = [None, _lp(" there", -1.5, 7, [(" the", -0.5, 3)]), _lp("!", -0.25, 9)]
    legacy = legacy_prompt(plps, "Hi there!")
    assert legacy["tokens"] == ["Hi", " there", "!"]
    assert legacy["token_logprobs"] == [None, -1.5, -0.25]
    assert legacy["top_logprobs"] == [None, {" the": -0.5}, {}]
    assert legacy["text_offset"] == [0, 2, 8]
    assert legacy_prompt(plps, "Hi there!", as_ids=True)["tokens"][1] == "token_id:7"
    v = vllm_prompt_logprobs(plps)
    assert v[0] is None and v[1]["7"] == {"logprob": -1.5, "rank": None,
                                          "decoded_token": " there"}
    assert v[1]["3"]["rank"] == 1
    # the records' ids stay out of OpenAI's shape unless asked for
    assert "id" not in logprobs_json([plps[1]])[0]
    assert logprobs_json([plps[1]], as_ids=True)[0]["top_logprobs"][0]["token"] == \
        "token_id:3"


def test_completions_echo_logprobs_max_tokens_0_renders_the_prompt_only():
    body = parse(CompletionRequest, {"prompt": "Hi there!", "echo": True, "logprobs": 1,
                                     "max_tokens": 0})
    ctx = Context("m", 3, prompt_text="Hi there!")
    done = Done("1", "length", 3, 0, prompt_logprobs=[None, _lp(" there", -1.5, 7),
                                                       _lp("!", -0.25, 9)])
    from engine.api.render import Answer
    a = Answer()
    a.add(done)
    out = CompletionRenderer(body, ctx).answer(a)
    c = out["choices"][0]
    assert c["text"] == "Hi there!"
    assert c["logprobs"]["tokens"] == ["Hi", " there", "!"]
    assert c["logprobs"]["token_logprobs"][0] is None
    stream = CompletionRenderer(body.model_copy(update={"stream": True}), ctx)
    assert stream.start() == []
    lines = [json.loads(b[6:]) for b in stream.event(done)]
    assert lines[0]["choices"][0]["logprobs"]["tokens"] == ["Hi", " there", "!"]


def test_llama_cpps_logit_bias_pairs():
    assert dict(chat(logit_bias=[[5, 2.5], [7, False]]).sampling.logit_bias) == \
        {5: 2.5, 7: -100.0}
    for bad in ([["Hello", 1.0]], [[-1, 1.0]], [[1, 2, 3]], [[1, 500]], [[1, 1]] * 2000):
        with pytest.raises(BadRequest) as e:
            chat(logit_bias=bad)
        assert e.value.param == "logit_bias"


def test_an_earlier_refusal_is_part_of_the_conversation():
    msgs = MSGS + [{"role": "assistant", "content": None, "refusal": "I can't."},
                   {"role": "user", "content": "why?"}]
    assert chat(messages=msgs).messages[1]["content"] == "I can't."
