"""The prefix cache on disk through a real node: a long prompt's KV survives a node
restart (the next identical turn reports cached tokens, as a hit from memory does) and the
answer is the same; without --prefix-disk-gb nothing is written."""

from __future__ import annotations

import httpx

from nodes import NodeProcess, home_with

LONG = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 12}]


def ask(node: NodeProcess) -> tuple[str, int]:
    r = httpx.post(node.url + "/v1/chat/completions", timeout=120, json={
        "model": "tiny-llama", "messages": LONG, "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    return body["choices"][0]["message"]["content"], \
        body["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_a_long_prompt_is_found_again_after_a_restart(tmp_path, tiny_model_dir):
    home = home_with(tmp_path, tiny_model_dir)
    node = NodeProcess(home, "tiny-llama", "--prefix-disk-gb", "1").wait_healthy()
    try:
        node.wait_ready()
        text, cached = ask(node)
        assert cached == 0
    finally:
        node.stop()
    assert list((home / "cache" / "prefix").glob("*/*.safetensors"))
    node = NodeProcess(home, "tiny-llama", "--prefix-disk-gb", "1").wait_healthy()
    try:
        node.wait_ready()
        again, cached = ask(node)
        assert again == text and cached > 256
    finally:
        node.stop()


def test_without_the_flag_nothing_is_written(tiny_node):
    ask(tiny_node)  # the session's node runs without --prefix-disk-gb
    assert not (tiny_node.home / "cache" / "prefix").exists()
