"""A pipeline share of every family runs through the model's own code: stages chained in
one process give exactly the logits of the whole model (prompt longer than the sliding
windows, then decode steps), for uneven splits over 2, 3 and 4 ranks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from families import FAMILIES  # noqa: E402

SPLITS = [((0, 1), (1, 4)), ((0, 2), (2, 3), (3, 4)), ((0, 1), (1, 2), (2, 3), (3, 4))]
# Older families with their own quirks (embedding scale, logit soft-capping, tied heads).
EXTRA = {
    "llama-tied": {**FAMILIES["llama"], "tie_word_embeddings": True},
    "gemma": {**FAMILIES["llama"], "model_type": "gemma", "head_dim": 16},
    "gemma2": {**FAMILIES["llama"], "model_type": "gemma2", "head_dim": 16,
               "query_pre_attn_scalar": 16, "final_logit_softcapping": 30.0,
               "attn_logit_softcapping": 50.0, "sliding_window": 8},
}
CONFIGS = {**FAMILIES, **EXTRA}


def build(config: dict, weights: list | None = None):
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    config = {**config, "vocab_size": 300}
    if "text_config" in config:
        config["text_config"] = {**config["text_config"], "vocab_size": 300}
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(0)
    model = model_cls(args_cls.from_dict(config))
    if weights is not None:
        model.load_weights(weights)
    mx.eval(model.parameters())
    return model, list(tree_flatten(model.parameters()))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_stages_chained_give_the_models_own_logits(name):
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from engine.runtime.stage import Stage

    model, weights = build(CONFIGS[name])
    steps = [mx.array([list(range(5, 25))])] + [mx.array([[t]]) for t in (3, 77, 12, 5)]
    cache = make_prompt_cache(model)
    want = [model(x, cache=cache) for x in steps]
    for split in SPLITS:
        stages = [Stage(build(CONFIGS[name], weights)[0], s, e) for s, e in split]
        caches = [s.make_cache() for s in stages]
        for x, logits in zip(steps, want):
            h = x
            for stage, c in zip(stages, caches):
                h = stage(h, c)
            got = stages[0].logits(h[:, -1:, :])
            assert mx.array_equal(logits[:, -1:, :], got).item(), (name, split)


def test_stage_holds_only_its_layers():
    from engine.runtime.stage import Stage

    model, _ = build(FAMILIES["qwen3_next"])
    stage = Stage(model, 1, 3)
    held = {id(m) for m in stage.layers}
    assert len(held) == 2
    assert all(not s.parameters() for i, s in enumerate(model.layers) if i not in (1, 2))
    assert model.layers[0].is_linear is not None  # the loop's flags survive on husks


def test_a_model_without_a_layers_list_is_refused():
    from engine.runtime.stage import Stage

    class NoLayers:  # e.g. a model whose blocks live in a dict
        layers = {"a": 1}

    with pytest.raises(ValueError, match="not a list"):
        Stage(NoLayers(), 0, 1)
