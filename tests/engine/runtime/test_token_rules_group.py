"""The token rules on rank 0 of a real two-rank group (MLX ring on 127.0.0.1): in
lockstep (one stream) and in the group's batch (four streams, with drafts), each request
from the worker's pipe as the node sends it, each answer checked for what its fields
must do, and a seeded request with every filter answering as one process does."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from dist_harness import Group, collect_all, send_all  # noqa: E402

from tiny import make_tiny_model  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="ring over loopback, Linux CI")

EOS, IM_START = 258, 257
HELLO = [{"role": "user", "content": "hello there"}]
SEEDED = {"max_tokens": 20, "temperature": 0.9, "seed": 9, "typical_p": 0.95, "min_keep": 2,
          "top_p": 0.95, "xtc_probability": 0.5, "xtc_threshold": 0.05,
          "samplers": ["typical_p", "xtc", "temperature", "top_p"], "min_tokens": 3,
          "bad_words": ["ab"], "repetition_penalty": 1.2, "repetition_context": 8}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.runtime.load import load_model

    folder = make_tiny_model(tmp_path_factory.mktemp("rules-group") / "tiny",
                             num_hidden_layers=6)
    model, tok, _ = load_model(folder)
    return folder, model, tok


def text(events):
    return "".join(e["text"] for e in events if e["ev"] == "delta")


@pytest.mark.parametrize("streams", [1, 4])
def test_rank_0_honours_the_token_rules(tiny, tmp_path, streams):
    from engine.runtime.generate import generate
    from engine.runtime.sampling import Sampling

    folder, model, tok = tiny
    a, b, c = (tok.encode(ch, add_special_tokens=False)[0] for ch in "abc")
    eos, b_first = {str(EOS): 100}, {str(b): 100}
    asks = {
        "ends": {"max_tokens": 10, "logit_bias": eos},
        "ignore_eos": {"max_tokens": 10, "logit_bias": eos, "ignore_eos": True},
        "min_tokens": {"max_tokens": 10, "logit_bias": eos, "min_tokens": 4},
        "stop_id": {"max_tokens": 10, "logit_bias": b_first, "stop_token_ids": [b],
                    "min_tokens": 3},
        "stop_id_shown": {"max_tokens": 10, "logit_bias": b_first, "stop_token_ids": [b],
                          "min_tokens": 3, "include_stop": True},
        "hidden": {"max_tokens": 2, "logit_bias": {str(IM_START): 100}},
        "shown": {"max_tokens": 2, "logit_bias": {str(IM_START): 100}, "skip_special": False},
        "words": {"max_tokens": 16, "allowed_token_ids": [a, b, c], "bad_words": ["ab"]},
        "seeded": SEEDED,
    }
    if streams > 1:  # the group's batch verifies guesses too
        asks = {k: {**s, "speculative": True} for k, s in asks.items()}
    group = Group(tmp_path / "g", folder, 2, "pipeline", [[0, 3], [3, 6]], streams=streams)
    try:
        group.ready()
        send_all(group.leader, [(HELLO, s) for s in asks.values()], "r")
        got = collect_all(group.leader, [f"r{i}" for i in range(len(asks))])
        out = {k: got[f"r{i}"] for i, k in enumerate(asks)}
        assert group.shutdown() == [0, 0]
    finally:
        group.kill()
    done = {k: ev[-1] for k, ev in out.items()}
    assert all(d["ev"] == "done" for d in done.values()), done
    assert (done["ends"]["finish_reason"], done["ends"]["generation_tokens"]) == ("stop", 1)
    assert (done["ignore_eos"]["finish_reason"], done["ignore_eos"]["generation_tokens"]) \
        == ("length", 10)
    assert (done["min_tokens"]["finish_reason"], done["min_tokens"]["generation_tokens"]) \
        == ("stop", 5)
    for k in ("stop_id", "stop_id_shown"):
        assert (done[k]["finish_reason"], done[k]["generation_tokens"]) == ("stop", 4)
    assert "b" not in text(out["stop_id"]) and text(out["stop_id_shown"]).endswith("b")
    assert text(out["stop_id_shown"]) == text(out["stop_id"]) + "b"
    assert text(out["hidden"]) == "" and done["hidden"]["generation_tokens"] == 2
    assert text(out["shown"]) == "<|im_start|> <|im_start|>"
    words = text(out["words"])
    assert set(words) <= set("abc") and "ab" not in words and len(words) == 16
    prompt = tok.apply_chat_template(HELLO, add_generation_prompt=True)
    seeded = {k: tuple(v) if isinstance(v, list) else v for k, v in SEEDED.items()}
    alone = list(generate(model, tok, prompt, Sampling(**seeded)))
    assert text(out["seeded"]) == "".join(r.text for r in alone)
