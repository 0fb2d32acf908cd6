"""The checkpoints users download, in one process: a tiny model from every real published
config.json (tests/real_configs.py: only sizes shrunk) in the format its repository ships
(tests/checkpoints.py), loaded the ways Shoal's workers load it and run from another
thread, as the batcher runs it. Greedy tokens must be what in-process mlx-lm gives on the
same weights (after the CPU path's float32 copy, which both sides make); what mlx-lm
can't run is refused before anything starts, naming the field.

The cross-process paths (pipeline ranks with lanes, tensor ranks) are in
tests/engine/runtime/test_real_checkpoints_groups.py."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from checkpoints import write_checkpoint  # noqa: E402
from real_configs import names  # noqa: E402

PROMPT = "Split me across nodes: " + "the quick brown fox " * 3  # crosses the windows
TOKENS = 8
# What in-process mlx-lm 0.32.2 can't run, and the field Shoal's refusal names.
REFUSED = {
    "mistralai__Ministral-3-3B-Instruct-2512": "model_type",  # text sizes only in text_config
    "nvidia__Kimi-K2.5-NVFP4": "quantization_config",  # ModelOpt tensors deepseek_v3 drops
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("real")
    return {n: write_checkpoint(root / n, n, seed=3, shards=3) for n in names()}


def in_thread(fn, *args):
    """fn(*args) on a fresh thread (one that made none of the model's arrays)."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn(*args)
        except BaseException as e:  # re-raised in the test's thread
            out["error"] = e
    t = threading.Thread(target=run)
    t.start()
    t.join(120)
    assert not t.is_alive(), "the model didn't answer within 120 s"
    if "error" in out:
        raise out["error"]
    return out["value"]


def reference(folder: Path, prompt: list[int]) -> list[int]:
    """mlx-lm in this thread: its loader, its generate loop, greedy."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model

    from engine.runtime.load import cpu_fast_path

    model, _ = load_model(folder)
    model = cpu_fast_path(model)
    steps = generate_step(mx.array(prompt), model, max_tokens=TOKENS)
    return [int(t) for t, _ in steps]


def lazy_arrays(root, skip=frozenset()) -> list[str]:
    """Paths of the arrays another thread can't evaluate (still lazy, from this one)."""
    import mlx.core as mx

    from engine.runtime.realize import arrays

    found = list(arrays(root, skip))

    def check() -> list[str]:
        bad = []
        for path, a in found:
            try:
                mx.eval(a)
            except RuntimeError:
                bad.append(path)
        return bad
    return in_thread(check)


def prompt_tokens(tokenizer) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}],
                                         add_generation_prompt=True)


RUNS = [n for n in names() if n not in REFUSED]


@pytest.mark.parametrize("name", RUNS)
def test_one_node_batched_with_a_prefix_hit(folders, name):
    from engine.runtime.load import load_model
    from engine.runtime.sampling import Sampling
    from engine.runtime.text_engine import one_process_generator

    model, tok, config = load_model(folders[name])
    assert lazy_arrays(model) == []
    prompt = prompt_tokens(tok)
    want = reference(folders[name], prompt)
    gen, streams = one_process_generator(model, tok, config, 4, 4096)

    def ask(p: list[int]) -> tuple[list[int], int]:
        recs = list(gen(model, tok, p, Sampling(max_tokens=TOKENS)))
        return [r.token for r in recs], recs[-1].cached_tokens

    other = prompt_tokens_of(tok, "a second conversation")
    if streams > 1:  # as the worker serves them: together, or one after the other
        both = in_thread(lambda: _together(ask, [prompt, other]))
    else:
        both = [in_thread(ask, prompt), in_thread(ask, other)]
    assert both[0][0] == want, "batched with another request"
    again, cached = in_thread(ask, prompt)
    assert again == want and cached > 0, "after a prefix-cache hit"


def prompt_tokens_of(tokenizer, text: str) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                         add_generation_prompt=True)


def _together(ask, prompts):
    """Every prompt asked at once, each from its own thread."""
    results: list = [None] * len(prompts)

    def one(i: int) -> None:
        results[i] = ask(prompts[i])
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


@pytest.mark.parametrize("name", RUNS)
def test_pipeline_ranks_loaded_from_their_shards(folders, name):
    """Three uneven stages, each loaded as a rank loads it (only its files, through the
    index), chained from another thread: the same greedy tokens."""
    import mlx.core as mx

    from engine.runtime.load import load_tokenizer, read_config
    from engine.runtime.shard_load import load_pipeline_stage

    folder = folders[name]
    n = read_config(folder).get("num_hidden_layers") or \
        read_config(folder)["text_config"]["num_hidden_layers"]
    splits = [(0, 1), (1, n - 2), (n - 2, n)]
    stages = [load_pipeline_stage(folder, s, e)[0] for s, e in splits]
    for st in stages:
        assert lazy_arrays(st, st.unheld()) == []
    prompt = prompt_tokens(load_tokenizer(folder, read_config(folder)))
    want = reference(folder, prompt)

    def run() -> list[int]:
        caches = [st.make_cache() for st in stages]
        out, x = [], mx.array([prompt])
        for _ in range(TOKENS):
            h = x
            for st, c in zip(stages, caches):
                h = st(h.astype(mx.float32) if h.dtype != mx.int32 else h, c)
            tok = int(mx.argmax(stages[0].logits(h[:, -1:, :]), axis=-1).item())
            out.append(tok)
            x = mx.array([[tok]])
        return out
    assert in_thread(run) == want


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_mlx_lm_cant_run_is_refused_naming_the_field(folders, name):
    from engine.errors import UnsupportedModel
    from engine.hub.checkpoint import inspect

    with pytest.raises(UnsupportedModel) as e:
        inspect(folders[name])
    assert e.value.param == REFUSED[name], e.value.message
    assert REFUSED[name].split(".")[0] in e.value.message
