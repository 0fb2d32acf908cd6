"""Every token id a client sends is bounded by what the model has, against a real node.

The attack: a logit_bias id at or past the vocabulary crashed the worker ("double free or
corruption", SIGSEGV) or, beside another stream, wrote past the logits unnoticed; {"²": 1}
was a 500. Now each is a 400 naming the field and giving the range, the worker is the same
process afterwards and a stream running beside the attack answers exactly as alone. The
model here has 300 ids and its tokenizer 259, so ids between the two are covered too.

A worker that still dies from a signal is diagnosable: the clients of the requests in
flight are told the signal and those requests' ids, and the worker's log holds each
request's line with the crash's stacks (faulthandler) after it."""

from __future__ import annotations

import os
import re
import signal
import threading

import httpx
import pytest

from engine.errors import ShoalError
from nodes import NodeProcess, home_with
from tiny import LLAMA, make_tiny_model

MODEL = "tiny-llama"
LIMIT = 259  # the tokenizer's length, less than the model's 300
HELLO = [{"role": "user", "content": "Tell me a long story"}]
# the attack: the vocabulary's size, the model's, far past it, negative, non-ASCII digits
NUMERIC = [LIMIT, 299, 300, 10**9, 2**40]
OTHER = ["²", "-1", "٣", "1e3", " 5", "0x10", "", "9" * 11]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    model = make_tiny_model(tmp_path_factory.mktemp("models") / MODEL, LLAMA, vocab_size=300)
    n = NodeProcess(home_with(tmp_path_factory.mktemp("bounds"), model), MODEL)
    try:
        n.wait_healthy().wait_ready()
        yield n
    finally:
        n.stop()


def worker_pid(node: NodeProcess) -> int | None:
    return httpx.get(node.url + "/shoal/status", timeout=10).json()["worker_pid"]


def post(node: NodeProcess, path: str, body: dict) -> httpx.Response:
    return httpx.post(node.url + path, json={"model": MODEL, **body}, timeout=60)


def attack(node: NodeProcess, key: str, route: str = "/v1/chat/completions",
           stream: bool = False) -> None:
    body = {"max_tokens": 2, "logit_bias": {key: 5}, "stream": stream}
    body |= {"messages": HELLO} if "chat" in route else {"prompt": "Once"}
    r = post(node, route, body)
    assert r.status_code == 400, (key, r.text)
    err = r.json()["error"]
    assert err["param"] == "logit_bias", err
    if key.isascii() and key.isdigit() and len(key) <= 10:
        assert err["message"] == (f"'logit_bias' key {int(key)} is not a token id of this "
                                  f"model (0 to {LIMIT - 1}).")


def answers(node: NodeProcess) -> None:
    r = post(node, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 3,
                                           "logit_bias": {str(LIMIT - 1): -100, "0": 1}})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_the_attack_is_a_400_naming_logit_bias_and_the_worker_lives(node, route, stream):
    pid = worker_pid(node)
    for key in [*map(str, NUMERIC), *OTHER]:
        attack(node, key, route, stream)
    assert worker_pid(node) == pid
    answers(node)


def _stream_text(node: NodeProcess, n: int, during=None) -> str:
    text, called = "", False
    for d in node.client.chat(HELLO, model=MODEL, max_tokens=n, temperature=0):
        text += d.text
        if during is not None and not called and text:
            called = True
            during()
    return text


def test_beside_a_running_stream_the_attack_changes_nothing(node):
    """The out-of-bounds write was silent in a batch: the stream beside it must answer
    token for token as alone, while every attack is refused."""
    pid = worker_pid(node)
    alone = _stream_text(node, 1500)
    in_flight = []

    def attacks() -> None:
        for key in map(str, NUMERIC):
            attack(node, key)
        in_flight.append(node.client.status().streams.in_flight)

    assert _stream_text(node, 1500, attacks) == alone
    assert in_flight == [1], "the stream was running while the attacks were answered"
    assert worker_pid(node) == pid
    answers(node)


@pytest.mark.parametrize("prompt", [[-1], [LIMIT], [299], [300], [72, 10**9], [2**32 + 1],
                                    [10**30], [[72, 300]]])
def test_a_token_prompt_outside_the_model_is_a_400(node, prompt):
    r = post(node, "/v1/completions", {"prompt": prompt, "max_tokens": 2})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "prompt" and f"(0 to {LIMIT - 1})" in err["message"], err


def test_token_prompts_inside_the_model_answer(node):
    pid = worker_pid(node)
    for prompt in ([72, 105], [[0, LIMIT - 1]]):
        r = post(node, "/v1/completions", {"prompt": prompt, "max_tokens": 2})
        assert r.status_code == 200, r.text
    assert worker_pid(node) == pid


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"messages": HELLO, "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": HELLO, "logprobs": True, "top_logprobs": -1},
     "top_logprobs"),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs"),  # 20, as vLLM takes
    ("/v1/responses", {"input": "x", "top_logprobs": 21}, "top_logprobs"),
    ("/api/chat", {"messages": HELLO, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/api/generate", {"prompt": "x", "options": {"seed": 2**64}}, "options.seed"),
    ("/api/generate", {"prompt": "x", "options": {"top_k": 10**7}}, "options.top_k"),
    ("/v1/messages", {"messages": HELLO, "max_tokens": 2, "top_k": 10**7}, "top_k"),
])
def test_counts_and_numbers_that_index_are_bounded(node, path, body, param):
    r = post(node, path, {"max_tokens": 2, **body} if path.startswith("/v1/c") else body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]  # Ollama's is the message; Anthropic's has no param
    assert err.get("param", param) == param and f"'{param}'" in err["message"] \
        if isinstance(err, dict) else f"'{param}'" in err, err


def test_the_most_top_logprobs_answer(node):
    r = post(node, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 2,
                                           "logprobs": True, "top_logprobs": 20})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 20


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGABRT])
def test_a_crash_names_the_signal_and_the_request(fresh_node, sig):
    """The node tells the client the signal and the request's id, and the worker's log
    has that request's line, then the crash's stacks (faulthandler)."""
    pid = fresh_node.client.status().worker_pid
    stream = iter(fresh_node.client.chat(HELLO, model=MODEL, max_tokens=100_000,
                                         temperature=0))
    next(stream)
    os.kill(pid, sig)
    with pytest.raises(ShoalError) as e:
        for _ in stream:
            pass
    message = str(e.value)
    # faulthandler dumps every thread from the signal handler while they run, and its
    # docs warn that this can itself fault: an abort may end as SIGSEGV on a busy box.
    # The log still says what came first.
    named = "SIGABRT|SIGSEGV" if sig == signal.SIGABRT else sig.name
    found = re.search(rf"exited unexpectedly: it crashed \(({named})\) while serving "
                      r"request ([0-9a-f]{32});", message)
    assert found, message
    log = (fresh_node.home / "logs" / "worker.log").read_text(errors="replace")
    started = log.rfind(f"request {found[2]} started")
    assert started >= 0, log[-2000:]
    first = "Aborted" if sig == signal.SIGABRT else "Segmentation fault"
    dump = log.find(f"Fatal Python error: {first}", started)
    assert dump > started, log[-3000:]
    assert "Current thread" in log[dump:] or "Thread 0x" in log[dump:]
    r = fresh_node.client.complete(HELLO, model=MODEL, max_tokens=2)  # a new worker
    assert r["usage"]["completion_tokens"] == 2
    assert fresh_node.client.status().worker_pid not in (None, pid)


def test_a_request_beside_a_crash_is_named_too(fresh_node):
    pid = fresh_node.client.status().worker_pid
    errors: list[str] = []
    started = threading.Barrier(3)

    def one() -> None:
        stream = iter(fresh_node.client.chat(HELLO, model=MODEL, max_tokens=100_000))
        next(stream)
        started.wait(30)
        try:
            for _ in stream:
                pass
        except ShoalError as err:
            errors.append(str(err))

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    started.wait(30)
    os.kill(pid, signal.SIGSEGV)
    for t in threads:
        t.join(30)
    assert len(errors) == 2
    ids = re.findall(r"[0-9a-f]{32}", errors[0])
    assert len(ids) == 2 and "while serving requests" in errors[0], errors[0]
    assert errors[1] == errors[0]
