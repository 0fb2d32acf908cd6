"""The user API described by /openapi.json (built from the request schemas that validate
it) and fuzzed with schemathesis against a real node: whatever a client sends, no
operation answers with a 5xx, and the node is healthy afterwards. Bounded: a few dozen
generated requests per operation, on a tiny model whose context is 256 tokens so no
generation runs long.

Schemathesis rarely reaches the values that index the model's arrays, so a targeted
hypothesis test sends those with hostile values on every protocol that carries them
(logit_bias keys huge, negative, between the tokenizer's and the model's vocabulary or
in non-ASCII digits; token-id prompts; top_logprobs and logprobs counts; seeds; top_k):
no 5xx, and the worker is the same live process afterwards. A third sends vLLM's and
llama.cpp's extensions with hostile values (id lists past the vocabulary, pathological
regexes and grammars, huge choices, unknown sampler names, counts past any context) and the
utility routes the same: the same promise."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nodes import NodeProcess, home_with
from tiny import LLAMA, make_tiny_model

EXAMPLES = 45  # per operation: about 600 requests in all
MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def small_node(tmp_path_factory):
    # 300 ids in the model, 259 in its tokenizer: ids between the two are hostile too
    model = make_tiny_model(tmp_path_factory.mktemp("models") / MODEL, LLAMA,
                            max_position_embeddings=256, vocab_size=300)
    node = NodeProcess(home_with(tmp_path_factory.mktemp("fuzz"), model), MODEL)
    try:
        node.wait_healthy().wait_ready()
        yield node
    finally:
        node.stop()


def test_the_document_names_every_generation_route(small_node):
    doc = httpx.get(small_node.url + "/openapi.json", timeout=10).json()
    assert doc["openapi"].startswith("3.")
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
                 "/api/chat", "/api/generate"):
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"]["$ref"].startswith("#/components/schemas/")
    # built from the route table: the routes without a body are there too
    for path, method in (("/api/show", "post"), ("/v1/models/{model_id}", "get"),
                         ("/v1/models", "get"), ("/api/tags", "get"), ("/api/ps", "get"),
                         ("/v1/responses/{rid}", "get"), ("/v1/messages/count_tokens", "post")):
        assert method in doc["paths"][path], path
    # llama.cpp's and vLLM's utility routes, and the node's own /metrics (the running app's
    # routes, not only the API's table)
    for path in ("/tokenize", "/detokenize", "/apply-template"):
        assert "requestBody" in doc["paths"][path]["post"], path
    for path in ("/props", "/metrics"):
        assert "get" in doc["paths"][path], path
    chat = doc["components"]["schemas"]["openai_schemas.ChatCompletionRequest"]
    assert chat["properties"]["ignore_eos"]["x-shoal-treatment"] == "honoured"


def test_no_request_makes_the_node_fail(small_node):
    import schemathesis
    from schemathesis.checks import not_a_server_error

    schema = schemathesis.openapi.from_url(small_node.url + "/openapi.json")
    seen = 0
    for result in schema.get_all_operations():
        op = result.ok()

        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy())
        def fuzz(case):
            response = case.call(base_url=small_node.url, timeout=60)
            case.validate_response(response, checks=[not_a_server_error])

        fuzz()
        seen += 1
    assert seen == 25  # 14 before the utility routes and /metrics, 19 before embeddings
    assert small_node.proc.poll() is None and httpx.get(small_node.url + "/health").is_success
    # (keep_alive 0 may have unloaded the model: no worker pid to compare, but none died)
    assert "exited unexpectedly" not in small_node.log.read_text(errors="replace")


HELLO = [{"role": "user", "content": "hi"}]
# ids: many at the vocabulary's end (the model has 300, its tokenizer 259), some far off
ids = (st.integers(250, 310) | st.integers(0, 2**40) | st.integers(-2**40, -1)
       | st.sampled_from([259, 299, 300, 2**31, 2**32, 2**63, 10**30, -2**63]))
bias_keys = ids.map(str) | ids.map(str) | st.text(max_size=6) | st.sampled_from(
    ["²", "٣", "٠", "-1", "+5", "5.0", "1e3", " 5", "5 ", "0x10", "", "9" * 11, "0" * 12])
bias_values = (st.integers(-100, 100) | st.floats(-100, 100)
               | st.sampled_from([float("nan"), float("inf"), -float("inf"), 101, -1e300]))
prompts = (st.lists(ids, min_size=1, max_size=6)
           | st.lists(st.lists(ids, min_size=1, max_size=3), min_size=1, max_size=2))
counts = st.integers(-5, 40) | st.sampled_from([2**31, 2**63, 10**30, -2**63])
seeds = st.integers(-2**70, 2**70)
HOSTILE = {  # field: its hostile values (valid ones among them)
    "logit_bias": st.dictionaries(bias_keys, bias_values, min_size=1, max_size=2),
    "prompt": prompts, "seed": seeds, "top_k": counts, "top_logprobs": counts,
    "logprobs": counts, "num_ctx": counts}
# route: (a body it answers, the fields that carry ids or counts there)
ROUTES = {
    # (logit_bias twice: the field of the attack that crashed workers)
    "/v1/chat/completions": ({"messages": HELLO, "max_tokens": 2, "logprobs": True},
                             ["logit_bias", "logit_bias", "seed", "top_k", "top_logprobs"]),
    "/v1/completions": ({"prompt": "Once", "max_tokens": 2},
                        ["logit_bias", "logit_bias", "prompt", "seed", "top_k", "logprobs"]),
    "/v1/responses": ({"input": "hi", "max_output_tokens": 2,
                       "include": ["message.output_text.logprobs"]}, ["top_logprobs"]),
    "/v1/messages": ({"messages": HELLO, "max_tokens": 2}, ["top_k"]),
    "/api/chat": ({"messages": HELLO, "stream": False, "logprobs": True,
                   "options": {"num_predict": 2}},
                  ["top_logprobs", "options.seed", "options.top_k", "options.num_ctx"]),
    "/api/generate": ({"prompt": "hi", "stream": False, "options": {"num_predict": 2}},
                      ["options.seed", "options.top_k", "options.num_ctx"]),
}


@st.composite
def hostile_requests(draw) -> tuple[str, dict]:
    """A route's body with one or two of its id or count fields hostile, so most reach
    the check they test instead of an earlier refusal."""
    path = draw(st.sampled_from(sorted(ROUTES)))
    base, fields = ROUTES[path]
    body = json.loads(json.dumps(base))
    for name in draw(st.lists(st.sampled_from(fields), min_size=1, max_size=2)):
        where, _, leaf = name.rpartition(".")
        (body[where] if where else body)[leaf] = draw(HOSTILE[leaf])
    return path, body


def test_hostile_ids_and_counts_leave_the_same_worker(small_node):
    """The fields that index the vocabulary or an array, with hostile values, on every
    protocol: never a 5xx, both refusals and answers happen, and the worker that served
    the first request serves the last."""
    warm = httpx.post(small_node.url + "/v1/chat/completions", timeout=60,
                      json={"model": MODEL, "messages": HELLO, "max_tokens": 1})
    assert warm.status_code == 200, warm.text  # (the fuzz above may have unloaded it)
    pid = httpx.get(small_node.url + "/shoal/status", timeout=10).json()["worker_pid"]
    statuses: set[int] = set()
    by_worker: list[str] = []  # refusals by the worker, where the vocabulary is known

    @settings(max_examples=200, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(path_body=hostile_requests())
    @example(path_body=("/v1/chat/completions", {**ROUTES["/v1/chat/completions"][0],
                                                 "logit_bias": {"300": 5}}))
    @example(path_body=("/v1/completions", {**ROUTES["/v1/completions"][0],
                                            "logit_bias": {"1000000000": -5, "²": 1}}))
    @example(path_body=("/v1/completions", {"prompt": [300], "max_tokens": 2}))
    def fuzz(path_body):
        path, body = path_body
        r = httpx.post(small_node.url + path, timeout=60,  # NaN and Infinity as written
                       content=json.dumps({"model": MODEL, **body}),
                       headers={"Content-Type": "application/json"})
        assert r.status_code < 500, (path, body, r.text)
        statuses.add(r.status_code)
        if "is not a token id of this model" in r.text:
            by_worker.append(path)

    fuzz()
    assert {200, 400} <= statuses and by_worker, "answers, refusals at the API and by the worker"
    status = httpx.get(small_node.url + "/shoal/status", timeout=10).json()
    assert status["worker_pid"] == pid, small_node.tail()
    assert "exited unexpectedly" not in small_node.log.read_text(errors="replace")


# vLLM's and llama.cpp's extensions: values a hostile client could send
id_lists = st.lists(ids, min_size=1, max_size=8) | st.lists(ids, max_size=0) | st.just(
    list(range(2000)))
regexes = st.sampled_from([
    "(a+)+$", "(a|a)*b", "[", "a{1000000}", "(?=a)b", "\\", "((((((((((a))))))))))*",
    "[^\\x00-\\x{10FFFF}]", ".*" * 200, "(a{1,100}){1,100}", "\\p{L}+", ""]) | st.text(
    max_size=40)
grammars = st.sampled_from([
    'root ::= "a" root', "root ::= root", 'root ::= x\nx ::= y\ny ::= x', "root ::=",
    "::= ::=", 'root ::= [^\\x00-\\x{10FFFF}]*', 'root ::= "a"{0,1000000}',
    "start: start", "%import common.WS", 'root ::= ("a" | "b")* "c"']) | st.text(max_size=40)
choices = st.lists(st.text(max_size=8), min_size=0, max_size=4) | st.just(
    ["x" * 5000]) | st.just([str(i) for i in range(3000)])
samplers = st.lists(st.sampled_from(["top_k", "typ_p", "top_p", "min_p", "xtc", "temperature",
                                     "dry", "penalties", "top_n_sigma", "mirostat", "", "x"]),
                    max_size=8) | st.text(max_size=12)
schemas = st.sampled_from([{"type": "object"}, {"$ref": "#/$defs/a", "$defs": {
    "a": {"$ref": "#/$defs/a"}}}, {"type": "string", "pattern": "(a+)+$"},
    {"type": "array", "minItems": 1000000}, {"enum": []}, {"type": "nope"}, "{", "[]"])
EXTENSIONS = {
    "stop_token_ids": id_lists, "allowed_token_ids": id_lists, "bad_words": st.lists(
        st.text(max_size=6), max_size=3) | st.just(["x"] * 2000),
    "min_tokens": counts, "truncate_prompt_tokens": counts, "prompt_logprobs": counts,
    "n_probs": counts, "min_keep": counts, "n_predict": counts, "repeat_last_n": counts,
    "typical_p": st.floats(-1, 2) | st.sampled_from([0.0, 1.0, 1e-300]),
    "xtc_probability": st.floats(-1, 2), "xtc_threshold": st.floats(-1, 2),
    "samplers": samplers, "guided_regex": regexes, "guided_grammar": grammars,
    "grammar": grammars, "guided_choice": choices, "guided_json": schemas,
    "json_schema": schemas, "structured_outputs": st.fixed_dictionaries(
        {}, optional={"regex": regexes, "choice": choices, "grammar": grammars,
                      "json": schemas}),
    "ignore_eos": st.booleans(), "skip_special_tokens": st.booleans(),
    "include_stop_str_in_output": st.booleans(), "echo": st.booleans(),
    "continue_final_message": st.booleans(), "add_generation_prompt": st.booleans(),
    "chat_template_kwargs": st.dictionaries(st.text(max_size=12), st.integers(), max_size=3),
    "documents": st.lists(st.dictionaries(st.text(max_size=5), st.text(max_size=5)),
                          max_size=3)}
CHAT_ONLY = {"echo", "continue_final_message", "add_generation_prompt",
             "chat_template_kwargs", "documents"}
UTILITY = {  # route: hostile bodies
    "/tokenize": st.fixed_dictionaries({"content": st.text(max_size=50)}, optional={
        "add_special": st.booleans(), "with_pieces": st.booleans(),
        "parse_special": st.booleans()}) | st.fixed_dictionaries(
        {"prompt": st.text(max_size=50)}, optional={"add_special_tokens": st.booleans(),
                                                     "return_token_strs": st.booleans()}),
    "/detokenize": st.fixed_dictionaries({"tokens": id_lists}),
    "/apply-template": st.fixed_dictionaries({"messages": st.just(HELLO)}, optional={
        "add_generation_prompt": st.booleans(), "continue_final_message": st.booleans(),
        "chat_template_kwargs": st.dictionaries(st.text(max_size=12), st.integers(),
                                                max_size=3),
        "documents": st.lists(st.dictionaries(st.text(max_size=5), st.text(max_size=5)),
                              max_size=3)}),
}


def _nested_schema(depth: int) -> dict:
    """A JSON schema of objects inside objects, as deep as the body limit lets it be."""
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def _deep_grammar(n: int) -> str:
    """A GBNF grammar whose rules chain n deep (each names the next)."""
    return "root ::= r1\n" + "\n".join(f"r{i} ::= r{i + 1}" for i in range(1, n)) \
        + f'\nr{n} ::= "a"'


@st.composite
def hostile_extensions(draw) -> tuple[str, dict]:
    """A chat, completions or utility request with one to three of the dialects' fields
    hostile (the rest a body the route answers)."""
    path = draw(st.sampled_from(["/v1/chat/completions", "/v1/completions", *UTILITY]))
    if path in UTILITY:
        return path, draw(UTILITY[path])
    body = json.loads(json.dumps(ROUTES[path][0]))
    names = sorted(n for n in EXTENSIONS if path == "/v1/chat/completions"
                   or n not in CHAT_ONLY)
    for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=3)):
        body[name] = draw(EXTENSIONS[name])
    return path, body


def test_hostile_extensions_leave_the_same_worker(small_node):
    """vLLM's and llama.cpp's fields and routes with hostile values: never a 5xx, every
    answer in time, and the worker that served the first request serves the last."""
    warm = httpx.post(small_node.url + "/v1/chat/completions", timeout=60,
                      json={"model": MODEL, "messages": HELLO, "max_tokens": 1})
    assert warm.status_code == 200, warm.text
    pid = httpx.get(small_node.url + "/shoal/status", timeout=10).json()["worker_pid"]
    statuses: set[int] = set()

    @settings(max_examples=200, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(path_body=hostile_extensions())
    @example(path_body=("/v1/chat/completions", {**ROUTES["/v1/chat/completions"][0],
                                                 "guided_regex": "(a+)+$"}))
    @example(path_body=("/v1/completions", {**ROUTES["/v1/completions"][0],
                                            "allowed_token_ids": [299, 300, 2**31]}))
    @example(path_body=("/detokenize", {"tokens": [258, 259, 299, 300]}))
    @example(path_body=("/v1/chat/completions", {**ROUTES["/v1/chat/completions"][0],
                                                 "guided_json": _nested_schema(20)}))
    @example(path_body=("/v1/completions", {**ROUTES["/v1/completions"][0],
                                            "guided_grammar": _deep_grammar(5000)}))
    def fuzz(path_body):
        path, body = path_body
        r = httpx.post(small_node.url + path, timeout=60,
                       content=json.dumps({"model": MODEL, **body}),
                       headers={"Content-Type": "application/json"})
        assert r.status_code < 500, (path, body, r.text)
        statuses.add(r.status_code)

    fuzz()
    assert {200, 400} <= statuses
    status = httpx.get(small_node.url + "/shoal/status", timeout=10).json()
    assert status["worker_pid"] == pid, small_node.tail()
    assert "exited unexpectedly" not in small_node.log.read_text(errors="replace")
