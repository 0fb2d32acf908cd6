"""The node-worker pipe's messages (engine/protocol.py): each one line, read back as the
same typed message; a worker's additions the node doesn't know are dropped, not a crash."""

from __future__ import annotations

import json

import pytest

from engine.protocol import (
    Fatal,
    Generate,
    GenerateRequest,
    RankReady,
    Ready,
    SamplingRequest,
    decode,
    encode,
    make,
)


def test_a_groups_fatal_names_its_rank_and_the_peer_it_lost():
    ev = make("fatal", code="peer_lost", message="Rank 0 lost rank 1", rank=0, peer=1,
              address="10.0.0.2:5001")
    line = encode(ev)
    assert json.loads(line) == {"ev": "fatal", "code": "peer_lost",
                                "message": "Rank 0 lost rank 1", "rank": 0, "peer": 1,
                                "address": "10.0.0.2:5001"}
    back = decode(line)
    assert back == ev and isinstance(back, Fatal) and back.peer == 1
    plain = decode(encode(Fatal("load_failed", "no weights")))  # one process: no rank
    assert isinstance(plain, Fatal) and plain.rank is None and plain.address is None


def test_unknown_fields_are_dropped_and_a_malformed_message_is_a_value_error():
    newer = b'{"ev":"fatal","code":"x","message":"m","rank":2,"hint":"a newer worker"}\n'
    assert decode(newer) == Fatal("x", "m", rank=2)
    with pytest.raises(ValueError, match="malformed fatal"):
        decode(b'{"ev":"fatal","code":"x"}\n')  # no message
    with pytest.raises(ValueError, match="unknown message"):
        decode(b'{"ev":"gossip"}\n')


def test_a_generate_and_a_ready_keep_their_typed_parts():
    req = GenerateRequest(
        messages=[{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "", "tool_calls": [
                      {"id": "c1", "type": "function",
                       "function": {"name": "f", "arguments": {"x": 1}}}]}],
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        sampling=SamplingRequest.of(max_tokens=5, stop="END", logit_bias={"7": 2},
                                    constraint={"json_schema": {"type": "object"}}))
    back = decode(encode(Generate("r1", req)))
    assert isinstance(back, Generate) and back.request == req
    assert back.request.sampling.stop == ("END",)
    assert back.request.sampling.logit_bias == ((7, 2.0),)
    ready = Ready("m", 2048, 42, rank=RankReady(1, 2, "pipeline", [2, 4], ["a"], 10, 20))
    got = decode(encode(ready))
    assert got == ready and isinstance(got, Ready) and got.rank is not None
    assert got.rank.report().bytes_read == 10
