"""vLLM's and llama.cpp's extensions on /v1/chat/completions and /v1/completions, through
a real node serving the tiny model, with the official openai SDK (extra_body) and raw
httpx: each field's answer checked for what it must do, streaming and not, and the 400
naming each field a node can't honour. (test_dialect_mapping.py checks the mapping
alone.)

The tiny model's end-of-turn logit is 0, so its greedy answers never end on their own: a
logit bias on it (EOS) makes it the first choice where a test needs an answer that ends."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import openai
import pytest

MODEL = "tiny-llama"
HELLO = [{"role": "user", "content": "Hello there"}]
EOS = 258  # <|im_end|>: tiny's byte tokenizer has 256 bytes, then three specials
WANTS_EOS = {"logit_bias": {str(EOS): 100}}


@pytest.fixture(scope="module")
def oai(tiny_node) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_node.url + "/v1", api_key="unused", max_retries=0,
                         timeout=60)


@pytest.fixture(scope="module")
def letters(tiny_model_dir: Path) -> dict:
    """Only a-z, and a repetition penalty: the greedy answer is plain, varied text."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    return {"allowed_token_ids": [tok.token_to_id(c) for c in "abcdefghijklmnopqrstuvwxyz"],
            "repetition_penalty": 1.5}


def chat(oai, n: int = 12, messages=HELLO, **extra):
    return oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=n,
                                       temperature=0, extra_body=extra)


def chat_stream(oai, n: int = 12, messages=HELLO, **extra) -> tuple[str, list]:
    chunks = list(oai.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=n, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body=extra))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks


def post(node, path: str, **body) -> httpx.Response:
    return httpx.post(node.url + path, json={"model": MODEL, **body}, timeout=60)


def test_ignore_eos_runs_to_max_tokens(oai):
    ends = chat(oai, **WANTS_EOS)
    assert ends.choices[0].finish_reason == "stop" and ends.usage.completion_tokens <= 1
    runs = chat(oai, ignore_eos=True, **WANTS_EOS)
    assert runs.choices[0].finish_reason == "length" and runs.usage.completion_tokens == 12
    text, chunks = chat_stream(oai, ignore_eos=True, **WANTS_EOS)
    assert text == runs.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 12


def test_min_tokens_forbids_the_end_before_it(oai):
    r = chat(oai, min_tokens=5, **WANTS_EOS)
    assert r.choices[0].finish_reason == "stop"
    assert 5 <= r.usage.completion_tokens <= 6  # five tokens, then the end it wanted
    assert len(r.choices[0].message.content) >= 5


def test_stop_token_ids_end_the_answer_and_include_stop_shows_the_stop(oai, letters):
    whole = chat(oai, n=16, **letters).choices[0].message.content
    i = next(i for i in range(2, len(whole)) if whole[i] not in whole[:i])
    stop_id = letters["allowed_token_ids"]["abcdefghijklmnopqrstuvwxyz".index(whole[i])]
    cut = chat(oai, n=16, **letters, stop_token_ids=[stop_id])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == whole[:i]
    kept = chat(oai, n=16, **letters, stop_token_ids=[stop_id],
                include_stop_str_in_output=True)
    assert kept.choices[0].message.content == whole[:i + 1]
    text, _ = chat_stream(oai, n=16, **letters, stop_token_ids=[stop_id])
    assert text == whole[:i]
    # a stop string too: without the flag it is cut, with it it stays
    stop = whole[i:i + 2]
    plain = chat(oai, n=16, **letters, stop=[stop])
    shown = chat(oai, n=16, **letters, stop=[stop],
                 include_stop_str_in_output=True)
    assert plain.choices[0].message.content == whole[:i]
    assert shown.choices[0].message.content == whole[:i] + stop


def test_allowed_token_ids_and_bad_words(oai, letters):
    text = chat(oai, n=16, **letters).choices[0].message.content
    assert re.fullmatch("[a-z]{16}", text)
    word = text[3:5]
    avoided = chat(oai, n=16, **letters, bad_words=[word])
    assert word not in avoided.choices[0].message.content


def test_continue_final_message_continues_the_same_message(oai, letters):
    whole = chat(oai, n=16, **letters).choices[0].message.content
    started = HELLO + [{"role": "assistant", "content": whole[:8]}]
    rest = chat(oai, n=8, messages=started, **letters,
                continue_final_message=True, add_generation_prompt=False)
    assert whole[:8] + rest.choices[0].message.content == whole
    echoed = chat(oai, n=8, messages=started, **letters,
                  continue_final_message=True, add_generation_prompt=False, echo=True)
    assert echoed.choices[0].message.content == whole  # vLLM's echo: the message whole
    text, _ = chat_stream(oai, n=8, messages=started, **letters,
                          continue_final_message=True, add_generation_prompt=False, echo=True)
    assert text == whole


def test_continuous_usage_stats_puts_usage_on_every_chunk(oai):
    chunks = list(oai.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    counts = [c.usage.completion_tokens for c in chunks]
    assert all(c.usage is not None for c in chunks)
    assert counts == sorted(counts) and counts[-1] == 6
    assert all(c.usage.prompt_tokens == chunks[0].usage.prompt_tokens for c in chunks)
    # on completions too
    pieces = list(oai.completions.create(
        model=MODEL, prompt="Once upon", max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert all(p.usage is not None for p in pieces) and pieces[-1].usage.completion_tokens == 5


@pytest.mark.parametrize("stream", [False, True])
def test_guided_fields_constrain_the_answer(oai, stream):
    def answer(**extra) -> str:
        if stream:
            return chat_stream(oai, n=20, **extra)[0]
        return chat(oai, n=20, **extra).choices[0].message.content
    assert answer(guided_choice=["yes", "no", "maybe"]) in ("yes", "no", "maybe")
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", answer(guided_regex="[0-9]{3}-[a-z]{2}"))
    assert answer(grammar='root ::= "red" | "green"') in ("red", "green")  # llama.cpp GBNF
    assert answer(guided_grammar='start: "up" | "down"') in ("up", "down")
    assert answer(structured_outputs={"choice": ["left", "right"]}) in ("left", "right")
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    for field in ("guided_json", "json_schema"):
        assert isinstance(json.loads(answer(**{field: schema}))["n"], int)


def test_guided_choice_on_completions(oai):
    r = oai.completions.create(model=MODEL, prompt="Pick:", max_tokens=10, temperature=0,
                               extra_body={"guided_choice": ["alpha", "beta"]})
    assert r.choices[0].text in ("alpha", "beta")


def test_echo_logprobs_max_tokens_0_return_the_prompts_logprobs(oai):
    """What lm-evaluation-harness asks of a local-completions server: the prompt scored."""
    prompt = "The sea is deep."
    r = oai.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True,
                               logprobs=1, temperature=0)
    c = r.choices[0]
    assert c.text == prompt and r.usage.completion_tokens == 0
    lp = c.logprobs
    assert "".join(lp.tokens) == prompt and len(lp.tokens) == r.usage.prompt_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x < 0 for x in lp.token_logprobs[1:])
    assert all(len(t) == 1 for t in lp.top_logprobs[1:])
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    streamed = list(oai.completions.create(model=MODEL, prompt=prompt, max_tokens=0,
                                           echo=True, logprobs=1, stream=True))
    assert "".join(s.choices[0].text for s in streamed) == prompt
    assert streamed[0].choices[0].logprobs.token_logprobs == lp.token_logprobs
    # with an answer after the prompt: the prompt's logprobs, then the answer's
    more = oai.completions.create(model=MODEL, prompt=prompt, max_tokens=3, echo=True,
                                  logprobs=0, temperature=0)
    assert len(more.choices[0].logprobs.tokens) == r.usage.prompt_tokens + 3
    assert more.choices[0].text.startswith(prompt)


def test_prompt_logprobs_and_token_ids(tiny_node):
    r = post(tiny_node, "/v1/chat/completions", messages=HELLO, max_tokens=3,
             prompt_logprobs=1, logprobs=True, top_logprobs=1,
             return_tokens_as_token_ids=True).json()
    plp = r["prompt_logprobs"]
    assert len(plp) == r["usage"]["prompt_tokens"] and plp[0] is None
    assert all(int(k) >= 0 for entry in plp[1:] for k in entry)
    content = r["choices"][0]["logprobs"]["content"]
    assert all(re.fullmatch(r"token_id:\d+", e["token"]) for e in content)
    s = post(tiny_node, "/v1/completions", prompt="abc", max_tokens=2, prompt_logprobs=0)
    assert len(s.json()["choices"][0]["prompt_logprobs"]) == 3


def test_include_reasoning_false_leaves_the_reasoning_out(forcing_node):
    """The forcing model thinks before it answers (tests/engine/api/forcing.py)."""
    def ask(**extra) -> dict:
        return post(forcing_node, "/v1/chat/completions", model="forcing", messages=HELLO,
                    max_tokens=12, **extra).json()["choices"][0]["message"]
    assert ask()["reasoning_content"] == "Checking."
    assert "reasoning_content" not in ask(include_reasoning=False)


def test_llama_cpp_requests(tiny_node):
    # what llama.cpp's web UI sends with its defaults (its sampler chain as letters)
    webui = post(tiny_node, "/v1/chat/completions", messages=HELLO, stream=False,
                 cache_prompt=True, samplers="edkypmxt", temperature=0.8, dynatemp_range=0,
                 dynatemp_exponent=1, top_k=40, top_p=0.95, min_p=0.05, typical_p=1,
                 xtc_probability=0, xtc_threshold=0.1, repeat_last_n=64, repeat_penalty=1,
                 presence_penalty=0, frequency_penalty=0, dry_multiplier=0, dry_base=1.75,
                 dry_allowed_length=2, dry_penalty_last_n=-1, max_tokens=4,
                 timings_per_token=False)
    assert webui.status_code == 200, webui.text
    n = post(tiny_node, "/v1/completions", prompt="Once", n_predict=7, temperature=0,
             n_probs=2).json()
    assert n["usage"]["completion_tokens"] == 7
    assert all(len(t) == 2 for t in n["choices"][0]["logprobs"]["top_logprobs"])


def _events(r: httpx.Response) -> list[dict]:
    assert r.status_code == 200, r.text
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


def test_vllm_benchmark_requests(tiny_node):
    """vLLM's serving benchmark's requests, as its request builders make them
    (vllm/benchmarks/lib/endpoint_request_func.py, async_request_openai_completions and
    async_request_openai_chat_completions, with --ignore-eos): usage from the stream's end
    must count exactly the tokens asked for."""
    completions = {"model": MODEL, "prompt": "The", "temperature": 0.0,
                   "repetition_penalty": 1.0, "max_tokens": 9, "logprobs": None,
                   "stream": True, "stream_options": {"include_usage": True},
                   "ignore_eos": True}
    r = httpx.post(tiny_node.url + "/v1/completions", json={**completions, **WANTS_EOS},
                   timeout=60)
    assert _events(r)[-1]["usage"]["completion_tokens"] == 9
    chat_body = {"model": MODEL, "messages": [{"role": "user", "content": [
                     {"type": "text", "text": "Tell me a story"}]}],
                 "temperature": 0.0, "max_completion_tokens": 7, "stream": True,
                 "stream_options": {"include_usage": True}, "ignore_eos": True}
    r = httpx.post(tiny_node.url + "/v1/chat/completions", json={**chat_body, **WANTS_EOS},
                   timeout=60)
    assert _events(r)[-1]["usage"]["completion_tokens"] == 7


def test_lm_evaluation_harness_loglikelihood(tiny_node, tiny_model_dir):
    """lm-evaluation-harness's local-completions loglikelihood request, as its
    _create_payload makes it (lm_eval/models/openai_completions.py: the token ids of
    context + continuation, max_tokens 1, logprobs 1, echo), read as its parse_logprobs
    reads it: the continuation's tokens are token_logprobs[ctxlen:-1]."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    context, continuation = tok.encode("The sea is").ids, tok.encode(" deep").ids
    body = {"model": MODEL, "prompt": [context + continuation], "temperature": 0,
            "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True}
    out = httpx.post(tiny_node.url + "/v1/completions", json=body, timeout=60).json()
    lp = out["choices"][0]["logprobs"]
    n = len(context) + len(continuation)
    assert len(lp["token_logprobs"]) == n + 1  # the prompt's, then the one answered
    ctxlen = len(context)
    scores = lp["token_logprobs"][ctxlen:-1]
    tops = lp["top_logprobs"][ctxlen:-1]
    assert len(scores) == len(continuation) and all(x < 0 for x in scores)
    is_greedy = all(x == max(top.values()) for x, top in zip(scores, tops))
    assert isinstance(is_greedy, bool)
    assert "".join(lp["tokens"][:n]) == "The sea is deep"


@pytest.mark.parametrize("field,body", [
    ("chat_template", {"chat_template": "{{ messages }}"}),
    ("mirostat", {"mirostat": 2}), ("dry_multiplier", {"dry_multiplier": 0.8}),
    ("dynatemp_range", {"dynatemp_range": 0.5}), ("top_n_sigma", {"top_n_sigma": 2}),
    ("samplers", {"samplers": ["top_k", "infill"]}),
    ("guided_regex", {"guided_json": {}, "guided_regex": "a"}),
    ("structured_outputs.structural_tag", {"structured_outputs": {"structural_tag": "{}"}}),
    ("guided_whitespace_pattern", {"guided_whitespace_pattern": " "}),
    ("n_predict", {"n_predict": 4}),  # beside max_tokens 3
    ("chat_template_kwargs.chat_template", {"chat_template_kwargs": {"chat_template": "x"}}),
    ("stop_token_ids", {"stop_token_ids": [10**6]}),
    ("allowed_token_ids", {"allowed_token_ids": [10**6]}),
    ("grammar", {"grammar": "root ::= " + "(" * 5000 + '"a"' + ")" * 5000}),
    ("guided_regex", {"guided_regex": "(" * 5000 + "a" + ")" * 5000})])
def test_what_cant_be_honoured_is_a_400_naming_it(oai, tiny_node, field, body):
    r = post(tiny_node, "/v1/chat/completions", messages=HELLO, max_tokens=3, **body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=3,
                                    extra_body=body)
    assert chat(oai, n=2).usage.completion_tokens == 2  # and the node serves on
