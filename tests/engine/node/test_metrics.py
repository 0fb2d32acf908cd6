"""/metrics as a Prometheus server scrapes it, from a real node serving real clients: the
counts match the usage the clients got, the histograms count every request, the gauges
show a request running and one waiting for its turn, a repeated prompt's prefix hits are
counted; the API key guards it and no web page can read it. GET /shoal/finished (the app's
charts) lists the same requests with the same figures."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nodes import NodeProcess, home_with

MODEL = "tiny-llama"
KEY = "metrics-test-key"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
         ) -> Iterator[NodeProcess]:
    """One request decoded at a time, so a second one waits for its turn."""
    home = home_with(tmp_path_factory.mktemp("metrics-node"), tiny_model_dir)
    n = NodeProcess(home, MODEL, "--max-streams", "1", api_key=KEY).wait_healthy()
    try:
        n.wait_ready()
        yield n
    finally:
        n.stop()


def scrape(node: NodeProcess) -> Samples:
    r = httpx.get(node.url + "/metrics", headers=node.headers, timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (the model's)."""
    want = set({"model_name": MODEL, **labels}.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def grew(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return total(after, name, **labels) - total(before, name, **labels)


def client(node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def test_counts_match_what_the_clients_got(node):
    oai = client(node)
    before = scrape(node)
    usages = [oai.chat.completions.create(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Hello there."}]
    ).usage]
    chunks = list(oai.chat.completions.create(
        model=MODEL, max_tokens=6, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Count to three."}]))
    usages.append(chunks[-1].usage)
    usages.append(oai.completions.create(model=MODEL, prompt="Once upon", max_tokens=5).usage)
    after = scrape(node)
    assert grew(before, after, "vllm:prompt_tokens_total") == sum(u.prompt_tokens
                                                                 for u in usages)
    assert grew(before, after, "vllm:generation_tokens_total") == \
        sum(u.completion_tokens for u in usages)
    for hist in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_queue_time_seconds", "vllm:request_inference_time_seconds",
                 "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
                 "vllm:request_time_per_output_token_seconds", "vllm:request_prompt_tokens",
                 "vllm:request_generation_tokens"):
        assert grew(before, after, hist + "_count") == 3, hist
    assert grew(before, after, "vllm:request_prompt_tokens_sum") == \
        sum(u.prompt_tokens for u in usages)
    assert grew(before, after, "vllm:time_to_first_token_seconds_sum") > 0
    gaps = grew(before, after, "vllm:inter_token_latency_seconds_count")
    assert gaps > 0 and grew(before, after, "vllm:time_per_output_token_seconds_count") == gaps
    assert grew(before, after, "vllm:request_success_total", finished_reason="stop") + \
        grew(before, after, "vllm:request_success_total", finished_reason="length") == 3
    assert grew(before, after, "vllm:request_success_total", finished_reason="error") == 0
    # the node's own name labels every series; nothing is counted twice
    nodes = {dict(ls)["node"] for (n, ls) in after if n == "vllm:prompt_tokens_total"}
    assert len(nodes) == 1 and nodes != {""}


def test_the_apps_records_are_the_same_requests(node):
    """GET /shoal/finished (what the charts read) lists each request with the figures
    its client got, recorded by the same code that counts them for /metrics."""
    def finished() -> list[dict]:
        r = httpx.get(node.url + "/shoal/finished", params={"since": time.time() - 60},
                      headers=node.headers, timeout=10)
        return r.json()["requests"]

    seen = max((f["seq"] for f in finished()), default=0)
    u = client(node).chat.completions.create(
        model=MODEL, max_tokens=7, messages=[{"role": "user", "content": "Why?"}]).usage
    mine = [f for f in finished() if f["seq"] > seen]
    assert len(mine) == 1
    f = mine[0]
    assert (f["model"], f["prompt_tokens"], f["generation_tokens"]) == \
        (MODEL, u.prompt_tokens, u.completion_tokens)
    assert f["ttft_s"] > 0 and f["e2e_s"] >= f["ttft_s"] and f["generation_tps"] > 0
    assert httpx.get(node.url + "/shoal/finished", params={"since": "soon"},
                     headers=node.headers).status_code == 400


def test_a_repeated_prompt_counts_prefix_hits(node):
    oai = client(node)
    messages = [{"role": "user", "content": "Tell me about rivers and seas. " * 8}]
    before = scrape(node)
    usages = [oai.chat.completions.create(model=MODEL, max_tokens=3, messages=messages).usage
              for _ in range(2)]
    after = scrape(node)
    cached = sum(u.prompt_tokens_details.cached_tokens or 0 for u in usages)
    assert cached >= usages[1].prompt_tokens - 1  # the resend ran only its last token
    assert grew(before, after, "vllm:prefix_cache_hits_total") == cached
    assert grew(before, after, "vllm:prefix_cache_queries_total") == \
        sum(u.prompt_tokens for u in usages)


def test_drafted_and_accepted_tokens_are_what_usage_said(node):
    echo = "Say this back: " + "one two three four, " * 8
    before = scrape(node)
    spec = [client(node).chat.completions.create(
        model=MODEL, max_tokens=48, temperature=0, extra_body={"speculative": True},
        messages=[{"role": "user", "content": echo}]).usage.model_extra["speculative"]
        for _ in range(2)]
    after = scrape(node)
    assert sum(s["drafted_tokens"] for s in spec) > 0, "the echo was drafted"
    assert grew(before, after, "vllm:spec_decode_num_draft_tokens_total") == \
        sum(s["drafted_tokens"] for s in spec)
    assert grew(before, after, "vllm:spec_decode_num_accepted_tokens_total") == \
        sum(s["accepted_tokens"] for s in spec)


def test_running_and_waiting_while_a_request_is_slow(node):
    """A long answer holds the node's one stream: it runs, the next request waits; both
    gauges go back to zero once they are done (a client that leaves is counted as abort)."""
    oai = client(node)
    before = scrape(node)
    long = oai.chat.completions.create(
        model=MODEL, max_tokens=4000, stream=True, extra_body={"ignore_eos": True},
        messages=[{"role": "user", "content": "Write a very long story."}])
    next(iter(long))  # it started
    second: list[object] = []
    t = threading.Thread(target=lambda: second.append(oai.chat.completions.create(
        model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "Hi"}])))
    t.start()
    try:
        seen = wait_until(node, lambda s: total(s, "vllm:num_requests_waiting") == 1)
        assert total(seen, "vllm:num_requests_running") == 1
    finally:
        long.close()  # the client leaves: the worker stops it, the second one runs
        t.join(120)
    assert second, "the waiting request was answered"
    after = wait_until(node, lambda s: total(s, "vllm:num_requests_running") == 0)
    assert total(after, "vllm:num_requests_waiting") == 0
    assert grew(before, after, "vllm:request_success_total", finished_reason="abort") == 1
    assert grew(before, after, "vllm:request_queue_time_seconds_sum") > 0


def wait_until(node: NodeProcess, ok, timeout: float = 60) -> Samples:
    deadline = time.monotonic() + timeout
    while True:
        s = scrape(node)
        if ok(s) or time.monotonic() > deadline:
            return s
        time.sleep(0.05)


def test_machine_figures_are_shoal_metrics(node):
    s = wait_until(node, lambda s: any(n == "shoal_memory_total_bytes" for n, _ in s))
    mem = [v for (n, _), v in s.items() if n == "shoal_memory_total_bytes"]
    assert mem and mem[0] > 0


def test_the_key_is_required_and_no_web_page_can_read_it(node):
    url = node.url + "/metrics"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(url, headers={"x-api-key": KEY}).status_code == 200
    page = httpx.get(url, headers={**node.headers, "Origin": "https://evil.example"})
    assert page.status_code == 403
    assert "access-control-allow-origin" not in page.headers
    assert "vllm:" not in page.text
    finished = httpx.get(node.url + "/shoal/finished",
                         headers={**node.headers, "Origin": "https://evil.example"})
    assert finished.status_code == 403


def test_openmetrics_when_the_scraper_asks(node):
    r = httpx.get(node.url + "/metrics", timeout=10, headers={
        **node.headers, "Accept": "application/openmetrics-text; version=1.0.0"})
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    assert r.text.rstrip().endswith("# EOF")
    for odd in ("application/openmetrics-text; version=abc", "text/plain; version=x.y",
                ";;,," * 1000):  # a scraper's header it can't read: the plain format
        r = httpx.get(node.url + "/metrics", headers={**node.headers, "Accept": odd})
        assert r.status_code == 200 and "vllm:prompt_tokens_total" in r.text, odd


@pytest.mark.slow
def test_each_node_counts_what_it_serves_and_the_app_reads_the_cluster(tmp_path,
                                                                        tiny_model_dir):
    """Two joined nodes: a request node b serves is in b's /metrics only (Prometheus scrapes
    both); a's GET /shoal/finished?peers=1, what the app's charts read, lists it with b's
    name, and plain /shoal/finished on a does not."""
    from nodes import start_cluster
    a, b = start_cluster(tmp_path, tiny_model_dir, 2)
    try:
        u = openai.OpenAI(base_url=b.url + "/v1", api_key="x", max_retries=0).completions \
            .create(model=MODEL, prompt="Hello", max_tokens=4).usage
        assert total(scrape(b), "vllm:prompt_tokens_total") == u.prompt_tokens
        assert total(scrape(a), "vllm:prompt_tokens_total") == 0
        assert httpx.get(a.url + "/shoal/finished").json()["requests"] == []
        rows = httpx.get(a.url + "/shoal/finished", params={"peers": 1},
                         timeout=10).json()["requests"]
        name = b.client.status().cluster.name
        assert [(r["node"], r["prompt_tokens"]) for r in rows] == [(name, u.prompt_tokens)]
    finally:
        for n in (a, b):
            n.stop()
