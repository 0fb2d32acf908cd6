"""The user API described by /openapi.json (built from the request schemas that validate
it) and fuzzed with schemathesis against a real node: whatever a client sends, no
operation answers with a 5xx, and the node is healthy afterwards. Bounded: a few dozen
generated requests per operation, on a tiny model whose context is 256 tokens so no
generation runs long.

Schemathesis rarely reaches the values that index the model's arrays, so a targeted
hypothesis test sends those with hostile values on every protocol that carries them
(logit_bias keys huge, negative, between the tokenizer's and the model's vocabulary or
in non-ASCII digits; token-id prompts; top_logprobs and logprobs counts; seeds; top_k):
no 5xx, and the worker is the same live process afterwards."""

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
    assert seen == 14
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
