"""The user API described by /openapi.json (built from the request schemas that validate
it) and fuzzed with schemathesis against a real node: whatever a client sends, no
operation answers with a 5xx, and the node is healthy afterwards. Bounded: a few dozen
generated requests per operation, on a tiny model whose context is 256 tokens so no
generation runs long."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from nodes import NodeProcess, home_with
from tiny import LLAMA, make_tiny_model

EXAMPLES = 45  # per operation: about 600 requests in all


@pytest.fixture(scope="module")
def small_node(tmp_path_factory):
    model = make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama", LLAMA,
                            max_position_embeddings=256)
    node = NodeProcess(home_with(tmp_path_factory.mktemp("fuzz"), model), "tiny-llama")
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
