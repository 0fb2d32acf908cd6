"""llama.cpp's and vLLM's utility routes against a real node on the tiny model (a byte-level
tokenizer: one token a byte, ChatML specials): /tokenize in either dialect, /detokenize,
/apply-template and /props, with the request bodies of llama.cpp's own server tests
(tools/server/tests/unit/test_tokenize.py, test_template.py) and vLLM's protocol
(TokenizeCompletionRequest, TokenizeChatRequest, DetokenizeRequest); hostile input gets a
400 naming the field and leaves the worker as it was; the routes want the API key and
follow the browser rules of /v1/*."""

from __future__ import annotations

import json

import httpx
import pytest

from nodes import NodeProcess
from tiny import CHATML

MODEL = "tiny-llama"
QUESTION = [{"role": "user", "content": "What is today?"}]
TEST_TOOL = {"type": "function", "function": {  # llama.cpp's test_tool_call.py TEST_TOOL
    "name": "test", "description": "",
    "parameters": {"type": "object", "properties": {"success": {
        "type": "boolean", "const": True}}, "required": ["success"]}}}


def post(node: NodeProcess, path: str, body: object, **kw: object) -> httpx.Response:
    return httpx.post(node.url + path, json=body, timeout=60, **kw)  # type: ignore[arg-type]


def ok(node: NodeProcess, path: str, body: object) -> dict:
    r = post(node, path, body)
    assert r.status_code == 200, r.text
    return r.json()


def refused(node: NodeProcess, path: str, body: object, param: str | None) -> str:
    r = post(node, path, body)
    assert r.status_code == 400, (body if len(str(body)) < 300 else path, r.text)
    err = r.json()["error"]
    assert err["param"] == param, err
    return err["message"]


def worker_pid(node: NodeProcess) -> int:
    return httpx.get(node.url + "/shoal/status", timeout=10).json()["worker_pid"]


# --- llama.cpp -----------------------------------------------------------------------------
def test_llama_tokenize_detokenize(tiny_node):
    content = "What is the capital of France ?"
    tokens = ok(tiny_node, "/tokenize", {"content": content})["tokens"]
    assert len(tokens) == len(content) and all(isinstance(t, int) for t in tokens)
    detok = ok(tiny_node, "/detokenize", {"tokens": tokens})
    assert detok["content"] == content
    assert detok["prompt"] == content  # vLLM's key for the same answer


def test_llama_tokenize_with_pieces(tiny_node):
    content = "This is a test string with unicode 媽 and emoji 🤗"
    tokens = ok(tiny_node, "/tokenize", {"content": content, "with_pieces": True})["tokens"]
    assert len(tokens) == len(content.encode())  # one token a byte
    pieces = []
    for t in tokens:
        assert set(t) == {"id", "piece"} and isinstance(t["id"], int) and t["piece"]
        # a piece that isn't UTF-8 alone is its bytes, as llama.cpp gives them
        pieces.append(t["piece"].encode() if isinstance(t["piece"], str) else bytes(t["piece"]))
    assert b"".join(pieces) == content.encode()
    assert tokens[0]["piece"] == "T" and isinstance(tokens[35]["piece"], list)


def test_llama_apply_template(tiny_node):
    prompt = ok(tiny_node, "/apply-template", {"messages": QUESTION})["prompt"]
    assert prompt == "<|im_start|>user\nWhat is today?<|im_end|>\n<|im_start|>assistant\n"
    bare = ok(tiny_node, "/apply-template", {"messages": QUESTION,
                                             "add_generation_prompt": False})["prompt"]
    assert bare == "<|im_start|>user\nWhat is today?<|im_end|>\n"
    for tools in (None, [], [TEST_TOOL]):
        got = ok(tiny_node, "/apply-template", {"messages": QUESTION, "tools": tools})
        assert got["prompt"].endswith("<|im_start|>assistant\n")
    assert "test" in got["prompt"]  # the tool is in the prompt


def test_llama_props(tiny_node):
    props = httpx.get(tiny_node.url + "/props", timeout=30).json()
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == 4096 and settings["params"]["temperature"] == 0.0
    assert props["model_path"] == MODEL  # the id, never a path on the node's machine
    assert props["chat_template"] == CHATML and props["build_info"].startswith("shoal-")
    chosen = httpx.get(tiny_node.url + "/props", params={"model": MODEL}, timeout=30)
    assert chosen.json()["model_path"] == MODEL
    gone = httpx.get(tiny_node.url + "/props", params={"model": "nope"}, timeout=30)
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "model"


# --- vLLM ----------------------------------------------------------------------------------
def test_vllm_tokenize_a_prompt(tiny_node):
    got = ok(tiny_node, "/tokenize", {"model": MODEL, "prompt": "Hello"})
    assert got["count"] == 5 and len(got["tokens"]) == 5 and got["max_model_len"] == 4096
    assert got["token_strs"] is None
    strs = ok(tiny_node, "/tokenize", {"model": MODEL, "prompt": "Hello",
                                       "return_token_strs": True})["token_strs"]
    assert strs == list("Hello")
    assert ok(tiny_node, "/detokenize", {"model": MODEL, "tokens": got["tokens"]}) == {
        "prompt": "Hello", "content": "Hello"}


def test_vllm_tokenize_a_conversation(tiny_node):
    text = ok(tiny_node, "/apply-template", {"messages": QUESTION})["prompt"]
    flat = ok(tiny_node, "/tokenize", {"model": MODEL, "prompt": text,
                                       "add_special_tokens": False})
    chat = ok(tiny_node, "/tokenize", {"model": MODEL, "messages": QUESTION})
    assert chat["tokens"] == flat["tokens"]  # the template's specials as single tokens
    assert chat["count"] == len(text) - 2 * len("<|im_start|>") - len("<|im_end|>") + 3
    bare = ok(tiny_node, "/tokenize", {"model": MODEL, "messages": QUESTION,
                                       "add_generation_prompt": False})
    assert bare["tokens"] == chat["tokens"][:bare["count"]]
    assert chat["count"] - bare["count"] == 1 + len("assistant\n")


def test_continue_final_message_ends_with_the_partial_answer(tiny_node):
    msgs = QUESTION + [{"role": "assistant", "content": "Today is"}]
    body = {"messages": msgs, "continue_final_message": True, "add_generation_prompt": False}
    prompt = ok(tiny_node, "/apply-template", body)["prompt"]
    assert prompt.endswith("<|im_start|>assistant\nToday is")
    got = ok(tiny_node, "/tokenize", {"model": MODEL, **body})
    text = ok(tiny_node, "/detokenize", {"tokens": got["tokens"]})["content"]
    assert text.endswith("assistant\nToday is")
    assert "continue_final_message" in refused(
        tiny_node, "/tokenize", {**body, "add_generation_prompt": True},
        "continue_final_message")


# --- hostile input ---------------------------------------------------------------------------
def test_hostile_input_is_a_400_naming_the_field(tiny_node):
    pid = worker_pid(tiny_node)
    past = refused(tiny_node, "/detokenize", {"tokens": [72, 10**9]}, "tokens")
    assert "1000000000" in past and "not a token id" in past
    refused(tiny_node, "/detokenize", {"tokens": [72, 2**40]}, "tokens[1]")
    refused(tiny_node, "/detokenize", {"tokens": [-1]}, "tokens[0]")
    refused(tiny_node, "/detokenize", {"tokens": [True]}, "tokens[0]")
    refused(tiny_node, "/detokenize", {"tokens": [1.5]}, "tokens[0]")
    refused(tiny_node, "/detokenize", {"tokens": "72"}, "tokens")
    refused(tiny_node, "/detokenize", {"tokens": [0] * 1_000_001}, "tokens")  # 2 MB
    # past the context is no reason to refuse a listing (vLLM's don't either)
    long = post(tiny_node, "/detokenize", {"tokens": [72] * 5000})
    assert long.status_code == 200 and len(long.json()["content"]) >= 5000, long.text
    refused(tiny_node, "/tokenize", {"content": "x" * 3_000_000}, "content")
    refused(tiny_node, "/tokenize", {"content": "Hi", "bogus": 1}, "bogus")
    refused(tiny_node, "/tokenize", {"content": "Hi", "parse_special": False}, "parse_special")
    refused(tiny_node, "/tokenize", {"content": 5}, "content")
    refused(tiny_node, "/tokenize", {"prompt": "Hi", "messages": QUESTION}, "prompt")
    refused(tiny_node, "/tokenize", {"model": MODEL}, "content")
    refused(tiny_node, "/tokenize", {"messages": []}, "messages")
    refused(tiny_node, "/tokenize", {"messages": QUESTION, "chat_template": "{{ 1 }}"},
            "chat_template")
    refused(tiny_node, "/apply-template", {"messages": [{"role": "wizard", "content": "x"}]},
            "messages[0].role")
    refused(tiny_node, "/apply-template", {"messages": QUESTION, "n_predict": 3}, "n_predict")
    deep: object = "x"
    for _ in range(200):
        deep = [deep]
    r = post(tiny_node, "/tokenize", {"content": "x", "nested": deep})
    assert r.status_code == 400
    r = httpx.post(tiny_node.url + "/tokenize", content=b"[1, 2", timeout=30,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    r = httpx.post(tiny_node.url + "/tokenize", content=json.dumps([1]), timeout=30,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert worker_pid(tiny_node) == pid  # the same worker, still serving
    assert ok(tiny_node, "/tokenize", {"content": "Hi"})["tokens"]


# --- the API key and the browser rules -------------------------------------------------------
@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    node = NodeProcess(tmp_path_factory.mktemp("keyed"), "none", "--cors-origin",
                       "http://localhost:3000", api_key="sekrit")
    try:
        yield node.wait_healthy()
    finally:
        node.stop()


ROUTES = [("POST", "/tokenize", {"content": "Hi"}), ("POST", "/detokenize", {"tokens": [1]}),
          ("POST", "/apply-template", {"messages": QUESTION}), ("GET", "/props", None)]


@pytest.mark.parametrize("method,path,body", ROUTES)
def test_the_routes_want_the_api_key(keyed, method, path, body):
    r = httpx.request(method, keyed.url + path, json=body, timeout=30)
    assert r.status_code == 401
    r = httpx.request(method, keyed.url + path, json=body, timeout=30, headers=keyed.headers)
    assert r.status_code != 401


@pytest.mark.parametrize("method,path,body", ROUTES)
def test_a_page_is_treated_as_on_v1(keyed, method, path, body):
    key = keyed.headers
    r = httpx.request(method, keyed.url + path, json=body, timeout=30,
                      headers={**key, "Origin": "http://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "cors_forbidden"
    r = httpx.request(method, keyed.url + path, json=body, timeout=30,
                      headers={**key, "Origin": "http://localhost:3000"})
    assert r.status_code != 403  # not a control route: an allowed page may call it
    assert r.headers["access-control-allow-origin"] == "http://localhost:3000"
    pre = httpx.options(keyed.url + path, timeout=30, headers={
        "Origin": "http://localhost:3000", "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert pre.status_code == 204
    form = httpx.post(keyed.url + path, content=b"content=Hi", timeout=30, headers={
        **key, "Content-Type": "application/x-www-form-urlencoded"}) if method == "POST" \
        else None
    assert form is None or form.status_code == 415


# --- fuzzed: each dialect's fields with hostile values, and bodies of no shape --------------
def _bodies():
    from hypothesis import strategies as st

    values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
        | st.text(max_size=20), lambda inner: st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
    ids = st.integers() | st.sampled_from([-1, 0, 258, 259, 299, 300, 2**32, 2**63])
    text = st.text(max_size=80) | st.sampled_from(["<|im_start|>", "<|im_end|>", "\x00",
                                                   "\ud800", "媽🤗", ""])
    flag = st.booleans() | values
    turn = st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer", "x"]),
         "content": text | st.none() | st.lists(st.fixed_dictionaries(
             {"type": st.sampled_from(["text", "image_url"]), "text": text}), max_size=2)})
    turns = st.lists(turn, max_size=4)
    model = st.just(MODEL) | text
    chat = {"add_generation_prompt": flag, "continue_final_message": flag,
            "chat_template_kwargs": st.dictionaries(st.text(max_size=10), values, max_size=3)
            | values, "tools": st.just([TEST_TOOL]) | values, "model": model,
            "tool_choice": st.sampled_from(["auto", "none", "required"]) | values
            | st.just({"type": "function", "function": {"name": "test"}})}
    return st.one_of(
        st.tuples(st.just("/tokenize"), st.fixed_dictionaries({"content": text}, optional={
            "add_special": flag, "with_pieces": flag, "parse_special": flag, "model": model})),
        st.tuples(st.just("/tokenize"), st.fixed_dictionaries({"prompt": text}, optional={
            "add_special_tokens": flag, "return_token_strs": flag, "model": model})),
        st.tuples(st.just("/tokenize"), st.fixed_dictionaries({"messages": turns}, optional={
            **chat, "add_special_tokens": flag, "return_token_strs": flag})),
        st.tuples(st.just("/apply-template"),
                  st.fixed_dictionaries({"messages": turns}, optional=chat)),
        st.tuples(st.just("/detokenize"), st.fixed_dictionaries(
            {"tokens": st.lists(ids, max_size=40) | values}, optional={"model": model})),
        st.tuples(st.sampled_from(["/tokenize", "/detokenize", "/apply-template"]), values))


def test_fuzzed_bodies_never_fail_the_node(tiny_node):
    from hypothesis import HealthCheck, given, settings

    pid = worker_pid(tiny_node)

    @settings(max_examples=200, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(_bodies())
    def one(case):
        path, body = case
        r = httpx.post(tiny_node.url + path, content=json.dumps(body), timeout=60,
                       headers={"Content-Type": "application/json"})  # lone surrogates too
        assert r.status_code in (200, 400, 404), (path, body, r.text)
        if r.status_code != 200:
            assert r.json()["error"]["message"]

    one()
    assert worker_pid(tiny_node) == pid
