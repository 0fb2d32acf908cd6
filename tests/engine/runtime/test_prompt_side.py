"""The prompt side of a request in the worker, each field against what it must do, on a
real tiny model and its byte tokenizer (ChatML): add_generation_prompt,
continue_final_message, documents, chat_template_kwargs, show_prompt, add_special,
truncate_prompt_tokens, max_tokens 0, prompt_logprobs, and the token-id fields' bounds."""

from __future__ import annotations

import json
import re
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.errors import BadRequest, ContextTooLong
from engine.protocol import Accepted, Delta, Done, GenerateRequest, SamplingRequest
from tiny import LLAMA, make_tiny_model

sys.path.insert(0, str(Path(__file__).parent))
from dist_harness import Group, Worker, collect, collect_all, texts  # noqa: E402

CHAT = [{"role": "user", "content": "Tell me a story."}]
DOCS_TEMPLATE = ("{% if documents %}<docs>{% for d in documents %}[{{ d['title'] }}] "
                 "{{ d['text'] }}\n{% endfor %}</docs>{% endif %}"
                 "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if persona %}persona={{ persona }}\n{% endif %}"
                 "{% if enable_thinking is defined %}thinking={{ enable_thinking }}\n{% endif %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.runtime.load import load_model

    model, tok, _ = load_model(make_tiny_model(tmp_path_factory.mktemp("prompt") / "m", LLAMA))
    return model, tok


@pytest.fixture(scope="module")
def docs_tok(tmp_path_factory, tiny):
    """The same model's tokenizer with a template that reads documents and variables."""
    from engine.runtime.load import load_model

    folder = make_tiny_model(tmp_path_factory.mktemp("docs") / "m", LLAMA)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg,
                                                              "chat_template": DOCS_TEMPLATE}))
    return load_model(folder)[1]


@pytest.fixture(scope="module")
def bos_tok(tmp_path_factory):
    """A tokenizer whose encode() adds a BOS (<|endoftext|>) unless told not to."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    from engine.runtime.load import load_model

    folder = make_tiny_model(tmp_path_factory.mktemp("bos") / "m", LLAMA)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    bos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = TemplateProcessing(single="<|endoftext|> $A",
                                            special_tokens=[("<|endoftext|>", bos)])
    tok.save(str(folder / "tokenizer.json"))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg,
                                                              "bos_token": "<|endoftext|>"}))
    return load_model(folder)[1], bos


def serve(model, tok, req: GenerateRequest, ctx: int = 4096, gen=None) -> list:
    from engine.runtime.generate import generate
    from engine.runtime.request import run

    out: list = []
    run("r", req, model, tok, ctx, gen or generate, threading.Event(), out.append)
    return out


def accepted(events) -> Accepted:
    return next(e for e in events if isinstance(e, Accepted))


def refused(model, tok, req: GenerateRequest, ctx: int = 4096) -> BadRequest:
    with pytest.raises(BadRequest) as e:
        serve(model, tok, req, ctx, gen=lambda *a, **k: pytest.fail("generated"))
    assert e.value.status == 400
    return e.value


def shown(model, tok, **fields) -> Accepted:
    return accepted(serve(model, tok, GenerateRequest(show_prompt=True, count_only=True,
                                                      **fields)))


# --- the template's ends ----------------------------------------------------------------
def test_without_the_generation_prompt_the_turns_end_with_the_last_message(tiny):
    with_header = shown(*tiny, messages=CHAT).prompt_text
    without = shown(*tiny, messages=CHAT, add_generation_prompt=False).prompt_text
    assert with_header == "<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\n"
    assert without == "<|im_start|>user\nTell me a story.<|im_end|>\n"


@pytest.mark.parametrize("header", [True, False])
def test_continue_final_continues_the_assistant_message_with_no_end_of_turn(tiny, header):
    """vLLM's continue_final_message: the last message stays open (no <|im_end|>, no new
    header), whatever add_generation_prompt says, and the answer follows it."""
    model, tok = tiny
    msgs = [*CHAT, {"role": "assistant", "content": "Once upon a"}]
    events = serve(model, tok, GenerateRequest(
        messages=msgs, continue_final=True, add_generation_prompt=header, show_prompt=True,
        sampling=SamplingRequest(max_tokens=3)))
    assert accepted(events).prompt_text == ("<|im_start|>user\nTell me a story.<|im_end|>\n"
                                            "<|im_start|>assistant\nOnce upon a")
    assert isinstance(events[-1], Done) and events[-1].generation_tokens == 3


def test_continue_final_without_a_template_leaves_the_last_line_open(tiny):
    from engine.runtime.template import plain

    msgs = [*CHAT, {"role": "assistant", "content": "Once"}]
    assert plain(msgs, GenerateRequest(messages=msgs, continue_final=True)) == \
        "user: Tell me a story.\nassistant: Once"
    assert plain(msgs, GenerateRequest(messages=msgs, add_generation_prompt=False)) == \
        "user: Tell me a story.\nassistant: Once\n"


# --- documents and template variables -----------------------------------------------------
def test_documents_reach_a_template_that_takes_them(tiny, docs_tok):
    docs = [{"title": "a", "text": "Cats sleep."}, {"title": "b", "text": "Dogs bark."}]
    text = shown(tiny[0], docs_tok, messages=CHAT, documents=docs).prompt_text
    assert text.startswith("<docs>[a] Cats sleep.\n[b] Dogs bark.\n</docs><|im_start|>user")


def test_documents_a_template_ignores_are_a_400_not_dropped(tiny):
    e = refused(*tiny, GenerateRequest(messages=CHAT, documents=[{"title": "a", "text": "x"}]))
    assert e.param == "documents" and "doesn't take documents" in e.message


def test_template_kwargs_reach_the_template_and_enable_thinking_goes_as_thinking(tiny, docs_tok):
    text = shown(tiny[0], docs_tok, messages=CHAT,
                 template_kwargs={"persona": "pirate", "enable_thinking": False}).prompt_text
    assert "persona=pirate\nthinking=False\n" in text
    # the request's own thinking switch wins over the kwarg
    text = shown(tiny[0], docs_tok, messages=CHAT, thinking=True,
                 template_kwargs={"enable_thinking": False}).prompt_text
    assert "thinking=True" in text


@pytest.mark.parametrize("key", ["tokenize", "messages", "tools", "documents", "chat_template",
                                 "add_generation_prompt", "continue_final_message",
                                 "return_dict", "a-b", "1x", "class", "", "x" * 65])
def test_template_kwargs_that_would_replace_the_request_or_are_no_name_are_a_400(tiny, key):
    e = refused(*tiny, GenerateRequest(messages=CHAT, template_kwargs={key: True}))
    assert e.param == "chat_template_kwargs"


def test_too_many_template_kwargs_or_a_non_boolean_thinking_are_a_400(tiny):
    assert refused(*tiny, GenerateRequest(messages=CHAT, template_kwargs={
        f"k{i}": i for i in range(65)})).param == "chat_template_kwargs"
    assert refused(*tiny, GenerateRequest(messages=CHAT, template_kwargs={
        "enable_thinking": "yes"})).param == "chat_template_kwargs"


# --- what the prompt is -------------------------------------------------------------------
def test_show_prompt_gives_a_chat_prompts_text_and_ids(tiny):
    from engine.runtime.request import prepare

    model, tok = tiny
    acc = shown(model, tok, messages=CHAT)
    ids = prepare(tok, GenerateRequest(messages=CHAT))[0]
    assert acc.prompt_ids == ids and acc.prompt_tokens == len(ids)
    assert acc.prompt_text == tok.decode(ids)
    # without show_prompt a chat's prompt isn't sent back (a raw prompt's text is: echo)
    plain_acc = accepted(serve(model, tok, GenerateRequest(messages=CHAT, count_only=True)))
    assert plain_acc.prompt_text is None and plain_acc.prompt_ids is None


def test_add_special_decides_a_raw_prompts_bos(tiny, bos_tok):
    tok, bos = bos_tok
    model = tiny[0]
    ids = {flag: shown(model, tok, prompt="hi", add_special=flag).prompt_ids
           for flag in (None, True, False)}
    assert ids[True] == [bos, *ids[False]] and ids[None] == ids[True]
    assert bos not in ids[False] and len(ids[False]) == 2
    # a chat's template puts in what it needs: the tokenizer adds nothing unless asked
    chat = shown(model, tok, messages=CHAT).prompt_ids
    assert chat[0] != bos and shown(model, tok, messages=CHAT, add_special=True).prompt_ids \
        == [bos, *chat]


def test_truncate_prompt_tokens_keeps_the_last_k_before_the_context_check(tiny):
    model, tok = tiny
    text = "".join(chr(ord("a") + i % 26) for i in range(300))  # 300 byte tokens
    full = tok.encode(text)
    acc = accepted(serve(model, tok, GenerateRequest(
        prompt=text, show_prompt=True, count_only=True,
        sampling=SamplingRequest(truncate_prompt_tokens=10))))
    assert acc.prompt_ids == full[-10:] and acc.prompt_tokens == 10
    assert acc.prompt_text == text[-10:]
    # longer than a 100-token context, yet served once cut to 50
    with pytest.raises(ContextTooLong):
        serve(model, tok, GenerateRequest(prompt=text, count_only=True), ctx=100)
    events = serve(model, tok, GenerateRequest(prompt=text, sampling=SamplingRequest(
        truncate_prompt_tokens=50, max_tokens=2)), ctx=100)
    assert events[-1].prompt_tokens == 50 and events[-1].generation_tokens == 2
    # a prompt already shorter is left alone
    assert shown(model, tok, prompt="abc", sampling=SamplingRequest(
        truncate_prompt_tokens=10)).prompt_ids == tok.encode("abc")


@pytest.mark.parametrize("k", [0, -1, 101, True])
def test_truncate_prompt_tokens_out_of_range_is_a_400(tiny, k):
    e = refused(*tiny, GenerateRequest(prompt="abc", sampling=SamplingRequest(
        truncate_prompt_tokens=k)), ctx=100)
    assert e.param == "truncate_prompt_tokens"


def test_truncating_a_fill_in_the_middle_prompt_is_a_400(tiny):
    e = refused(*tiny, GenerateRequest(prompt="abc", suffix="x", sampling=SamplingRequest(
        truncate_prompt_tokens=2)))
    assert e.param == "truncate_prompt_tokens"


def test_max_tokens_zero_decodes_nothing(tiny):
    model, tok = tiny
    events = serve(model, tok, GenerateRequest(prompt="hello", sampling=SamplingRequest(
        max_tokens=0)), gen=lambda *a, **k: pytest.fail("decoded"))
    assert not any(isinstance(e, Delta) for e in events)
    done = events[-1]
    assert isinstance(done, Done) and (done.finish_reason, done.prompt_tokens,
                                       done.generation_tokens) == ("length", 5, 0)
    # a prompt that fills the context exactly still scores: nothing is generated
    assert serve(model, tok, GenerateRequest(prompt="hello", sampling=SamplingRequest(
        max_tokens=0)), ctx=5)[-1].finish_reason == "length"


# --- prompt logprobs ----------------------------------------------------------------------
def direct(model, prompt: list[int]):
    import mlx.core as mx

    logits = model(mx.array(prompt)[None])[0].astype(mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


@pytest.mark.parametrize("chunk_rows", [None, 3])
def test_prompt_logprobs_match_the_models_own_log_softmax(tiny, monkeypatch, chunk_rows):
    """Each prompt token's logprob given those before it, and the top 5 there, as one
    forward pass over the whole prompt computes them; in chunks of 3 rows too."""
    import numpy as np

    from engine.runtime import prompt_logprobs

    model, tok = tiny
    if chunk_rows:
        monkeypatch.setattr(prompt_logprobs, "CHUNK_BYTES", 4 * 259 * chunk_rows)
    text = "The cat sat on the mat."
    ids = tok.encode(text)
    done = serve(model, tok, GenerateRequest(prompt=text, sampling=SamplingRequest(
        max_tokens=0, prompt_logprobs=5)))[-1]
    got = done.prompt_logprobs
    want = np.array(direct(model, ids))
    assert len(got) == len(ids) and got[0] is None
    for i, e in enumerate(got[1:], start=1):
        row = want[i - 1]
        assert e.id == ids[i] and e.token == tok.decode([ids[i]])
        assert e.logprob == pytest.approx(row[ids[i]], abs=1e-4)
        assert [t.id for t in e.top_logprobs] == list(np.argsort(-row)[:5])
        assert [t.logprob for t in e.top_logprobs] == pytest.approx(
            sorted(row, reverse=True)[:5], abs=1e-4)
        assert all(t.bytes == list(t.token.encode()) for t in e.top_logprobs)


def test_prompt_logprobs_ride_along_a_generation_and_the_pipe(tiny):
    from engine.protocol import decode, encode

    model, tok = tiny
    events = serve(model, tok, GenerateRequest(messages=CHAT, sampling=SamplingRequest(
        max_tokens=2, prompt_logprobs=0, logprobs=2)))
    done = events[-1]
    assert done.generation_tokens == 2 and len(done.prompt_logprobs) == done.prompt_tokens
    assert all(e.top_logprobs == [] for e in done.prompt_logprobs[1:])
    again = decode(encode(done))
    assert again.prompt_logprobs == done.prompt_logprobs
    # the generated tokens' logprobs carry ids too, the chosen token's and each top one's
    lps = [lp for e in events if isinstance(e, Delta) for lp in e.logprobs or []] + \
        (done.logprobs or [])
    assert len(lps) == 2 and all(lp.id is not None and len(lp.top_logprobs) == 2
                                 and all(t.id is not None for t in lp.top_logprobs)
                                 for lp in lps)
    assert all(lp.token == tok.decode([lp.id]) for lp in lps)


def test_prompt_logprobs_of_a_one_token_prompt_and_a_cancelled_one(tiny):
    from engine.runtime.prompt_logprobs import compute

    model, tok = tiny
    assert compute(model, tok, [5], 3) == [None]
    stop = threading.Event()
    stop.set()
    assert compute(model, tok, [5, 6, 7], 3, stop) == [None]


def test_prompt_logprobs_on_a_split_model_is_a_400_naming_it(tiny):
    """A group's rank 0 holds a pipeline Stage or a model whose linears mlx-lm's shard()
    split over the group (here with a group of two that no other rank joins)."""
    import mlx.nn as nn
    from mlx.nn.layers.distributed import shard_linear

    from engine.runtime.prompt_logprobs import whole

    model, tok = tiny
    sharded = nn.Sequential(nn.Linear(8, 8))
    sharded.layers[0] = shard_linear(sharded.layers[0], "all-to-sharded",
                                     group=SimpleNamespace(size=lambda: 2, rank=lambda: 0))
    stage = SimpleNamespace(model=model)  # a pipeline rank's Stage: no modules of its own
    assert whole(model) and not whole(sharded) and not whole(stage)
    for split in (stage, sharded):
        with pytest.raises(BadRequest) as e:
            serve(split, tok, GenerateRequest(prompt="hi", sampling=SamplingRequest(
                prompt_logprobs=1)), gen=lambda *a, **k: pytest.fail("generated"))
        assert e.value.param == "prompt_logprobs" and "whole" in e.value.message


# --- ids' bounds --------------------------------------------------------------------------
@pytest.mark.parametrize("field,value", [
    ("stop_token_ids", (259,)), ("stop_token_ids", (-1,)), ("stop_token_ids", (2**40,)),
    ("allowed_token_ids", (5, 10**9)), ("allowed_token_ids", tuple(range(4097))),
    ("prompt_logprobs", 21), ("prompt_logprobs", -1)])
def test_ids_and_counts_out_of_range_are_a_400_naming_the_field(tiny, field, value):
    e = refused(*tiny, GenerateRequest(prompt="hi", sampling=SamplingRequest(
        **{field: value})))
    assert e.param == field and field in e.message


def test_ids_in_range_pass(tiny):
    events = serve(*tiny, GenerateRequest(prompt="hi", sampling=SamplingRequest(
        max_tokens=1, stop_token_ids=(0, 258), allowed_token_ids=(1, 2, 3),
        prompt_logprobs=20)))
    assert isinstance(events[-1], Done)



def test_prompt_logprobs_too_many_for_one_answer_are_a_400_before_any_is_computed(tiny,
                                                                                   monkeypatch):
    """The answer rides one pipe line, which the node reads up to 16 MiB."""
    from engine.runtime import prompt_logprobs

    model, tok = tiny
    calls = []
    monkeypatch.setattr(type(model), "__call__", lambda *a, **k: calls.append(1))
    text = "x" * 7200  # 7,199 scored tokens x 21 > 150,000
    with pytest.raises(BadRequest) as e:
        serve(model, tok, GenerateRequest(prompt=text, sampling=SamplingRequest(
            max_tokens=0, prompt_logprobs=20)), ctx=8192)
    assert e.value.param == "prompt_logprobs" and not calls
    monkeypatch.undo()
    monkeypatch.setattr(prompt_logprobs, "MAX_JSON_BYTES", 1000)  # long tokens: measured
    with pytest.raises(BadRequest) as e:
        serve(model, tok, GenerateRequest(prompt="x" * 100, sampling=SamplingRequest(
            max_tokens=0, prompt_logprobs=1)))
    assert e.value.param == "prompt_logprobs"


# --- through the pipe, on each path a request is served by ---------------------------------
PIPE_PATHS = {"alone": (None, 1), "batch": (None, 4), "pipeline": ("pipeline", 1),
              "tensor": ("tensor", 1)}


@pytest.mark.skipif(sys.platform != "linux", reason="ring over loopback, Linux CI")
@pytest.mark.parametrize("path", [pytest.param(p, marks=[pytest.mark.slow] if PIPE_PATHS[p][0]
                                               else []) for p in PIPE_PATHS])
def test_a_worker_serves_the_prompt_side_over_the_pipe(tmp_path, tmp_path_factory, path):
    """As a node sends them: prompt logprobs with max_tokens 0 (refused on a group's rank
    0, which holds a part of the model), show_prompt, continue_final, a regex, and ids past
    the vocabulary, while a long answer runs beside them unchanged."""
    model = make_tiny_model(tmp_path_factory.mktemp("pipe") / "tiny", LLAMA)
    strategy, streams = PIPE_PATHS[path]
    group = None
    if strategy is None:
        w = Worker(["--model", str(model), "--model-id", "m", "--streams", str(streams)],
                   tmp_path / "w.log")
        ranks = [w]
        w.expect(lambda e: e["ev"] == "ready")
    else:
        group = Group(tmp_path, model, 2, strategy,
                      [[0, 2], [2, 4]] if strategy == "pipeline" else None, streams=streams)
        ranks, w = group.ranks, group.leader
        group.ready()
    long = {"messages": CHAT, "sampling": {"max_tokens": 120, "temperature": 0}}
    asks = {
        "score": {"prompt": "The cat sat.", "sampling": {"max_tokens": 0,
                                                         "prompt_logprobs": 2}},
        "shown": {"messages": [*CHAT, {"role": "assistant", "content": "Once"}],
                  "continue_final": True, "show_prompt": True,
                  "sampling": {"max_tokens": 2}},
        "regex": {"prompt": "n:", "sampling": {"max_tokens": 20, "temperature": 1.0,
                                               "constraint": {"regex": "[0-9]{4}",
                                                              "param": "guided_regex"}}},
        "stopid": {"prompt": "x", "sampling": {"stop_token_ids": [10**9]}},
    }
    try:
        w.send({"op": "generate", "id": "alone", "request": long})
        alone = texts(collect(w, "alone"))
        w.send({"op": "generate", "id": "long", "request": long})
        for rid, req in asks.items():
            w.send({"op": "generate", "id": rid, "request": req})
        got = collect_all(w, ["long", *asks])
        assert texts(got["long"]) == alone
        score = got["score"][-1]
        if strategy is None:
            assert score["ev"] == "done" and score["finish_reason"] == "length"
            lps = score["prompt_logprobs"]
            assert lps[0] is None and len(lps) == 12 and all(
                len(e["top_logprobs"]) == 2 and "id" in e for e in lps[1:])
        else:
            assert score["ev"] == "error" and score["param"] == "prompt_logprobs"
        acc = next(e for e in got["shown"] if e["ev"] == "accepted")
        assert acc["prompt_text"].endswith("<|im_start|>assistant\nOnce")
        assert len(acc["prompt_ids"]) == acc["prompt_tokens"]
        assert got["regex"][-1]["ev"] == "done"
        assert re.fullmatch("[0-9]{4}", "".join(texts(got["regex"])))
        bad = got["stopid"][-1]
        assert bad["ev"] == "error" and bad["param"] == "stop_token_ids"
        assert [r.proc.poll() for r in ranks] == [None] * len(ranks)
    finally:
        if group is not None:
            group.kill()
        else:
            w.kill()
