"""The CPU prefill attention (engine/runtime/cpu_attention.py) answers as MLX's own."""

from __future__ import annotations

import pytest

mx = pytest.importorskip("mlx.core")


def _mlx_own():
    """MLX's kernel, whether or not this process has installed the CPU attention."""
    from engine.runtime import cpu_attention
    return cpu_attention._installed[0] if cpu_attention._installed \
        else mx.fast.scaled_dot_product_attention


def _masks(b: int, h: int, n: int, keys: int) -> list:
    causal = mx.arange(keys - n, keys)[:, None] >= mx.arange(keys)[None]
    padded = mx.broadcast_to(causal, (b, 1, n, keys)) & \
        (mx.arange(keys)[None, None, None] >= mx.array([0] + [3] * (b - 1))[:, None, None, None])
    return [None, "causal", causal, padded, mx.where(causal, 0.0, -1e9),
            mx.broadcast_to(causal, (b, h, n, keys))]


@pytest.mark.parametrize("blocks", [False, True])
@pytest.mark.parametrize("b,h,kv,n,keys", [(1, 9, 3, 64, 64), (1, 9, 3, 40, 300),
                                           (2, 8, 2, 32, 45), (1, 6, 1, 33, 70),
                                           (2, 8, 2, 32, 32),  # padded rows see no key
                                           (1, 9, 3, 1, 100)])
def test_the_same_attention_as_mlx_for_every_mask(b, h, kv, n, keys, blocks, monkeypatch):
    """Whole, and with the queries in blocks of 32 (as a long prompt's chunks go)."""
    from engine.runtime import cpu_attention
    from engine.runtime.cpu_attention import attention

    if blocks:
        monkeypatch.setattr(cpu_attention, "SCORES_BYTES", 1)

    mx.random.seed(0)
    q = mx.random.normal((b, h, n, 64))
    k, v = mx.random.normal((b, kv, keys, 64)), mx.random.normal((b, kv, keys, 64))
    for mask in _masks(b, h, n, keys):
        want = _mlx_own()(q, k, v, scale=0.125, mask=mask)
        got = attention(q, k, v, scale=0.125, mask=mask)
        assert got.shape == want.shape
        assert mx.allclose(got, want, atol=1e-5).item()


def test_a_long_prompt_gives_the_same_tokens(tmp_path, monkeypatch):
    """A tiny model prefilling 200 tokens in chunks greedy-decodes the same tokens with
    the CPU attention as with MLX's kernel."""
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    import engine.runtime.cpu_attention as cpu_attention
    from tiny import make_tiny_model

    model, _ = load(str(make_tiny_model(tmp_path / "m")))
    prompt = mx.array([(i * 37) % 200 + 3 for i in range(200)])

    def tokens() -> list[int]:
        steps = generate_step(prompt, model, prefill_step_size=64)
        return [int(t) for (t, _), _ in zip(steps, range(12))]

    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", _mlx_own())
    monkeypatch.setattr(cpu_attention, "_installed", [])
    monkeypatch.delenv("SHOAL_CPU_ATTENTION", raising=False)
    before = tokens()
    cpu_attention.install()
    assert mx.fast.scaled_dot_product_attention is cpu_attention.attention
    calls, power = [], mx.power
    monkeypatch.setattr(mx, "power", lambda *a: calls.append(1) or power(*a))
    assert tokens() == before
    assert len(calls) >= 3 * 4  # the three 64-token chunks attended this way, each layer
