"""The prefix cache's disk tier: a finished prompt's KV is found again by a new worker
(a fresh prefix cache over the same folder), the answer from it is the one without it,
and whatever is wrong on disk (a truncated file, a garbled index, a full budget, a
folder it can't write, another model's entries) is skipped, never served."""

from __future__ import annotations

import json
import logging

import pytest

from tiny import make_tiny_model

TEXT = "The quick brown fox jumps over the lazy dog. " * 12


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.runtime.load import load_model

    folder = make_tiny_model(tmp_path_factory.mktemp("disk") / "tiny-llama")
    model, tok, _ = load_model(folder)
    return model, tok, folder


def prompt_of(tok, text=TEXT):
    return tok.apply_chat_template([{"role": "user", "content": text}],
                                   add_generation_prompt=True)


def answer(model, tok, prompt, prefix):
    from engine.runtime.generate import generate
    from engine.runtime.sampling import Sampling

    recs = list(generate(model, tok, prompt, Sampling(max_tokens=12), prefix=prefix))
    return [r.token for r in recs if r.token is not None], recs[-1].cached_tokens


def cache_over(folder, budget=1 << 30):
    from engine.runtime.disk_cache import DiskCache
    from engine.runtime.prefix import PrefixCache
    return PrefixCache(4096, disk=DiskCache(folder, budget))


def test_a_new_worker_finds_a_finished_prompt_on_disk(tiny, tmp_path):
    model, tok, _ = tiny
    prompt = prompt_of(tok)
    assert len(prompt) > 256  # the disk keeps prompts worth loading
    want, cached = answer(model, tok, prompt, cache_over(tmp_path))
    assert cached == 0
    again = cache_over(tmp_path)  # a restarted worker: memory empty, the disk kept
    got, cached = answer(model, tok, prompt, again)
    assert got == want and cached == len(prompt) - 1
    assert again.stats()["disk_hits"] == 1
    longer = [*prompt[:-5], *prompt_of(tok, "and then?")]  # shares most of the prompt
    got, cached = answer(model, tok, longer, cache_over(tmp_path))
    assert cached >= len(prompt) - 6
    assert got == answer(model, tok, longer, None)[0]


def test_damaged_entries_are_dropped_never_served(tiny, tmp_path, caplog):
    model, tok, _ = tiny
    prompt = prompt_of(tok)
    want, _ = answer(model, tok, prompt, cache_over(tmp_path))
    (entry,) = tmp_path.glob("*.safetensors")
    with caplog.at_level(logging.WARNING):
        entry.write_bytes(entry.read_bytes()[:1000])  # truncated, the index not
        got, cached = answer(model, tok, prompt, cache_over(tmp_path))
    assert got == want and cached == 0 and "dropping" in caplog.text
    assert entry.stat().st_size > 1000  # that answer's KV was written again, whole
    (tmp_path / "index.json").write_text("{not json")
    with caplog.at_level(logging.WARNING):
        got, cached = answer(model, tok, prompt, cache_over(tmp_path))
    assert got == want and cached == 0 and "damaged" in caplog.text
    index = json.loads((tmp_path / "index.json").read_text())
    name = next(iter(index))
    (tmp_path / f"{name}.safetensors").write_bytes(b"\0" * index[name]["bytes"])
    with caplog.at_level(logging.WARNING):  # the right size, but no cache in it
        got, cached = answer(model, tok, prompt, cache_over(tmp_path))
    assert got == want and cached == 0 and "can't be read" in caplog.text


def test_the_budget_keeps_the_most_recent_and_a_full_disk_is_skipped(tiny, tmp_path,
                                                                      caplog):
    model, tok, _ = tiny
    first = prompt_of(tok)
    answer(model, tok, first, cache_over(tmp_path))
    size = json.loads((tmp_path / "index.json").read_text()).popitem()[1]["bytes"]
    second = prompt_of(tok, TEXT.upper())
    answer(model, tok, second, cache_over(tmp_path, budget=int(size * 1.5)))
    index = json.loads((tmp_path / "index.json").read_text())
    assert [e["tokens"][:len(second)] == second for e in index.values()] == [True]
    (tmp_path / "a-file").write_text("")  # a folder that can't be made (root can write
    with caplog.at_level(logging.WARNING):  # anywhere, so no permission would stop it)
        got, _ = answer(model, tok, first, cache_over(tmp_path / "a-file" / "cache"))
    assert got and "going on without it" in caplog.text


def test_another_model_or_kv_keeps_its_own_folder(tiny, tmp_path):
    from engine.runtime.disk_cache import fingerprint

    _, _, folder = tiny
    other = make_tiny_model(tmp_path / "other", seed=1)  # same shapes, other weights
    assert fingerprint(folder, None) == fingerprint(folder, None)
    assert fingerprint(folder, None) != fingerprint(other, None)
    assert fingerprint(folder, None) != fingerprint(folder, 8)
