"""The checkpoints users download (tests/real_configs.py, in their repositories' formats),
served by real worker processes over MLX's ring on loopback: a 3-rank pipeline split
unevenly with a lane per rank, and 2 tensor ranks where the family can split. Two
requests decode together, then one is sent again and hits the prefix cache; each answer
is token for token what mlx-lm gives in this process on the same weights (after the CPU
path's float32 copy, which both make). How a group splits a model is its family's: one
checkpoint runs per family, quantization and rope scaling (Llama-3.1-8B, not also its
Instruct; DeepSeek-V3, not also V3.1); tests/engine/runtime/test_real_checkpoints.py
serves every checkpoint in one process."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dist_harness import Group, collect_all, generate, send_all, texts  # noqa: E402
from test_real_checkpoints import REFUSED  # noqa: E402

from checkpoints import write_checkpoint  # noqa: E402
from real_configs import names, published, shrink  # noqa: E402

pytestmark = [pytest.mark.skipif(sys.platform != "linux", reason="ring over loopback"),
              pytest.mark.slow]

HELLO = [{"role": "user", "content": "Split me across nodes: " + "the quick brown fox " * 3}]
OTHER = [{"role": "user", "content": "a second conversation"}]
TOKENS = 8


def _distinct() -> list[str]:
    seen: dict[tuple, str] = {}
    for n in names():
        c = published(n)
        rope = c.get("rope_scaling") or (c.get("text_config") or {}).get("rope_scaling") or {}
        quant = "quantization" in c or "quantization_config" in c
        seen.setdefault((c["model_type"], quant, rope.get("rope_type") or rope.get("type")), n)
    return [n for n in seen.values() if n not in REFUSED]


RUNS = _distinct()


def _tensor_ok(name: str) -> bool:
    from engine.modelconfig import text_config
    from engine.placement.families import strategy_refusal

    cfg = text_config(shrink(published(name), 264))
    heads, kv = cfg.get("num_attention_heads", 0), cfg.get("num_key_value_heads") or 1
    return strategy_refusal(str(published(name)["model_type"]), "tensor") is None \
        and heads % 2 == 0 and kv % 2 == 0


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("real-groups")
    return {n: write_checkpoint(root / n, n, seed=3, shards=3) for n in RUNS}


@pytest.fixture(scope="module")
def reference(folders) -> dict[str, list[str]]:
    """mlx-lm's own answer to each conversation: its loader, its stream_generate."""
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_sampler
    from mlx_lm.utils import load_model

    from engine.runtime.load import cpu_fast_path, load_tokenizer, read_config

    out = {}
    for name, folder in folders.items():
        model = cpu_fast_path(load_model(folder)[0])
        tok = load_tokenizer(folder, read_config(folder))
        out[name] = ["".join(r.text for r in stream_generate(
            model, tok, tok.apply_chat_template(msgs, add_generation_prompt=True),
            max_tokens=TOKENS, sampler=make_sampler(temp=0.0))) for msgs in (HELLO, OTHER)]
    return out


def _serve(group: Group, want: list[str]) -> None:
    """Both conversations at once, then the first again: exact, and a prefix-cache hit."""
    try:
        group.ready()
        send_all(group.leader, [(HELLO, {"max_tokens": TOKENS}),
                                (OTHER, {"max_tokens": TOKENS})], "r")
        got = collect_all(group.leader, ["r0", "r1"])
        assert ["".join(texts(got[r])) for r in ("r0", "r1")] == want
        again = generate(group.leader, "again", HELLO, max_tokens=TOKENS)
        assert "".join(texts(again)) == want[0]
        assert again[-1]["cached_tokens"] > 0, "the resend hits the prefix cache"
    finally:
        group.kill()


@pytest.mark.parametrize("name", RUNS)
def test_three_uneven_pipeline_ranks_with_lanes(folders, reference, tmp_path, name):
    n = json.loads((folders[name] / "config.json").read_text())
    layers = (n.get("text_config") or n)["num_hidden_layers"]
    _serve(Group(tmp_path, folders[name], 3, "pipeline", streams=4, lanes=3,
                 layers=[[0, 1], [1, layers - 2], [layers - 2, layers]]), reference[name])


@pytest.mark.parametrize("name", [n for n in RUNS if _tensor_ok(n)])
def test_two_tensor_ranks(folders, reference, tmp_path, name):
    _serve(Group(tmp_path, folders[name], 2, "tensor", streams=4), reference[name])
