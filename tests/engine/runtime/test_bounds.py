"""The token ids a request may carry, rule by rule: the least of the model's vocabulary and
the tokenizer's length bounds them, and a request is refused naming the field before its
generator (any path's) sees it."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from engine.errors import BadRequest
from engine.protocol import GenerateRequest, SamplingRequest
from tiny import LLAMA, make_tiny_model

TOKENIZER = 259  # the byte tokenizer's 256 bytes and 3 specials


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """Tiny models whose vocabulary is wider (300) and narrower (200) than the tokenizer."""
    from engine.runtime.load import load_model

    root = tmp_path_factory.mktemp("bounds")
    out = {}
    for vocab in (300, 200):
        model, tok, _ = load_model(make_tiny_model(root / f"v{vocab}", LLAMA, vocab_size=vocab))
        out[vocab] = (model, tok)
    return out


def test_the_limit_is_the_least_of_model_and_tokenizer(loaded):
    from engine.runtime.bounds import model_vocab, token_limit

    wide, narrow = loaded[300], loaded[200]
    assert model_vocab(wide[0]) == 300 and token_limit(*wide) == TOKENIZER
    assert model_vocab(narrow[0]) == 200 and token_limit(*narrow) == 200


def test_a_text_model_inside_another_and_a_model_without_a_config():
    import mlx.nn as nn

    from engine.runtime.bounds import model_vocab

    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.args = SimpleNamespace(text_config={"vocab_size": 77})
            self.embed = nn.Embedding(100, 4)

    class Bare(nn.Module):  # a position embedding beside the token embedding
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(500, 4), nn.Embedding(64, 4)

    assert model_vocab(Wrapper()) == 77
    assert model_vocab(SimpleNamespace(model=Wrapper())) == 77  # a pipeline rank's Stage
    assert model_vocab(Bare()) == 500
    assert model_vocab(nn.Linear(2, 2)) is None


def _refused(req: GenerateRequest, limit: int = 259) -> BadRequest:
    from engine.runtime.bounds import check_request

    with pytest.raises(BadRequest) as e:
        check_request(req, limit)
    return e.value


@pytest.mark.parametrize("token", [259, 299, 300, 10**9, 2**40, -1])
def test_a_bias_id_outside_the_model_is_a_400_that_gives_the_range(token):
    e = _refused(GenerateRequest(prompt="x", sampling=SamplingRequest.of(
        logit_bias={str(token): 1})))
    assert e.param == "logit_bias" and e.status == 400
    assert e.message == f"'logit_bias' key {token} is not a token id of this model (0 to 258)."


@pytest.mark.parametrize("bias", [float("nan"), float("inf"), 101.0, -1e9])
def test_a_bias_off_the_scale_from_the_pipe_is_a_400(bias):
    e = _refused(GenerateRequest(prompt="x", sampling=SamplingRequest(logit_bias=((5, bias),))))
    assert e.param == "logit_bias"


@pytest.mark.parametrize("prompt", [[-1], [1, 259], [2**32 + 1], [10**30]])
def test_a_token_prompt_outside_the_model_is_a_400(prompt):
    e = _refused(GenerateRequest(prompt=prompt))
    assert e.param == "prompt" and "(0 to 258)" in e.message


def test_ids_inside_the_model_pass():
    from engine.runtime.bounds import check_request

    check_request(GenerateRequest(prompt=[0, 258], sampling=SamplingRequest.of(
        logit_bias={"0": -100, "258": 100})), 259)


def test_a_prompt_the_tokenizer_encodes_past_the_model_is_refused_before_it_runs(loaded):
    """The tokenizer's specials (256-258) are past a 200-token model: a chat's template
    puts them in, and the embedding must never see them."""
    from engine.runtime.request import run

    model, tok = loaded[200]
    called = []
    with pytest.raises(BadRequest) as e:
        run("r", GenerateRequest(messages=[{"role": "user", "content": "hi"}]), model, tok,
            4096, lambda *a, **k: called.append(1) or iter(()), threading.Event(),
            lambda m: None)
    assert e.value.param == "messages" and "0 to 199" in e.value.message and not called


@pytest.mark.parametrize("req", [
    GenerateRequest(prompt="hi", sampling=SamplingRequest.of(logit_bias={"259": 5})),
    GenerateRequest(prompt=[1, 2, 280])])
def test_run_refuses_before_the_generator_or_the_tokenizer_sees_the_ids(loaded, req):
    from engine.runtime.request import run

    model, tok = loaded[300]
    emitted, called = [], []
    with pytest.raises(BadRequest):
        run("r", req, model, tok, 4096, lambda *a, **k: called.append(1) or iter(()),
            threading.Event(), emitted.append)
    assert not called and not emitted


def test_top_logprobs_past_a_tiny_vocabulary_give_all_of_it():
    import mlx.core as mx

    from engine.runtime.sampling import token_logprobs

    lp = mx.log(mx.softmax(mx.array([[1.0, 3.0, 2.0]]), axis=-1))
    chosen, top = token_logprobs(lp, 1, 20)
    assert [t for t, _ in top] == [1, 2, 0] and chosen == top[0][1]


def test_a_draft_model_guesses_only_ids_both_models_take(loaded):
    """A draft model padded wider than the target never guesses past the target's ids,
    and one narrower than a context's ids is never fed them (no guesses instead)."""
    from engine.runtime.speculative import ModelDraft

    wide, narrow = loaded[300][0], loaded[200][0]
    context = list(range(40, 60)) * 3
    guesses = ModelDraft(wide, limit=120).propose(context, 16)
    assert len(guesses) == 16 and max(guesses) < 120
    assert ModelDraft(narrow, limit=200).propose([5, 6, 250, 7], 4) == []
