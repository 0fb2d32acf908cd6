"""Length bucketing, a pure rule with its properties: every input once, each batch's
padded tokens and count bounded, lengths within a batch similar, and pooling as
sentence-transformers pools over right-padded rows."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from engine.runtime.embedding.batches import SLACK, SPREAD, buckets, pad, pool


@given(st.lists(st.integers(1, 5000), max_size=300), st.integers(1, 8192),
       st.integers(1, 128))
def test_buckets_cover_each_input_once_within_bounds(lengths, tokens, most):
    batches = buckets(lengths, tokens, most)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        longest, shortest = max(lengths[i] for i in b), min(lengths[i] for i in b)
        assert len(b) == 1 or (len(b) <= most and len(b) * longest <= tokens
                               and longest <= shortest * SPREAD + SLACK)


def test_two_thousand_short_texts_make_few_full_batches():
    batches = buckets([20 + i % 5 for i in range(2000)])
    assert len(batches) <= 2000 // 64 + 2 and max(map(len, batches)) == 64


def test_pooling_ignores_the_padding():
    rows = [[5, 6, 7], [8]]
    ids, mask = pad(rows)
    h = mx.array(np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2))
    assert pool(h, mask, "mean").tolist() == [[2.0, 3.0], [6.0, 7.0]]
    assert pool(h, mask, "lasttoken").tolist() == [[4.0, 5.0], [6.0, 7.0]]
    assert pool(h, mask, "cls").tolist() == [[0.0, 1.0], [6.0, 7.0]]
    assert pool(h, mask, "max").tolist() == [[4.0, 5.0], [6.0, 7.0]]
