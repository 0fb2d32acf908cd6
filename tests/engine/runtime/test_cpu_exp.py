"""Sigmoid and logsumexp on the CPU (engine/runtime/cpu_exp.py) answer as MLX's own."""

from __future__ import annotations

import pytest

mx = pytest.importorskip("mlx.core")


def _mlx_own(name: str):
    """MLX's function, whether or not this process has installed the CPU ones."""
    from engine.runtime.cpu_exp import _mlx
    return _mlx(name)


def test_sigmoid_is_mlx_s_over_the_whole_range():
    from engine.runtime.cpu_exp import sigmoid

    inf = float("inf")
    x = mx.concatenate([mx.linspace(-120, 120, 48001), mx.array([inf, -inf, 0.0])])
    got, want = sigmoid(x), _mlx_own("sigmoid")(x)
    assert mx.allclose(got, want, atol=1e-7, rtol=1e-6).item()
    assert got[-3].item() == 1.0 and got[-2].item() == 0.0 and got[-1].item() == 0.5


@pytest.mark.parametrize("axis,keepdims", [(-1, True), (-1, False), (None, False),
                                           (None, True), (0, False), ((0, 1), False),
                                           ([1], True)])
def test_logsumexp_is_mlx_s_for_every_axis(axis, keepdims):
    from engine.runtime.cpu_exp import logsumexp

    mx.random.seed(0)
    logits = mx.random.normal((16, 4096)) * 8
    got = logsumexp(logits, axis=axis, keepdims=keepdims)
    want = _mlx_own("logsumexp")(logits, axis=axis, keepdims=keepdims)
    assert got.shape == want.shape
    assert mx.allclose(got, want, rtol=1e-6).item()


def test_logsumexp_of_masked_and_infinite_rows_is_mlx_s():
    """A row with every token masked (-inf) stays -inf, not NaN: the sampler must see it
    as MLX's own would."""
    from engine.runtime.cpu_exp import logsumexp

    inf = float("inf")
    rows = mx.array([[-inf, -inf, -inf], [0.0, -inf, 1.0], [1.0, inf, 2.0]])
    got = logsumexp(rows, axis=-1).tolist()
    assert got == _mlx_own("logsumexp")(rows, axis=-1).tolist()
    assert got[0] == -inf and got[2] == inf


def test_other_types_go_to_mlx_s_own():
    from engine.runtime.cpu_exp import logsumexp, sigmoid

    half = mx.array([1.0, 2.0, -3.0], mx.float16)
    assert sigmoid(half).dtype == mx.float16
    assert sigmoid(half).tolist() == _mlx_own("sigmoid")(half).tolist()
    assert logsumexp(half).tolist() == _mlx_own("logsumexp")(half).tolist()
    assert logsumexp(mx.array([1, 2, 3])).item() == \
        pytest.approx(_mlx_own("logsumexp")(mx.array([1, 2, 3])).item())


def test_a_model_gives_the_same_tokens_through_them(tmp_path, monkeypatch):
    """A tiny llama (SwiGLU) greedy-decodes the same tokens, and its gates and the
    logits' normalising run through mx.power."""
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    import engine.runtime.cpu_exp as cpu_exp
    from tiny import make_tiny_model

    model, _ = load(str(make_tiny_model(tmp_path / "m")))
    prompt = mx.array([(i * 37) % 200 + 3 for i in range(40)])

    def tokens() -> list[int]:
        return [int(t) for (t, _), _ in zip(generate_step(prompt, model), range(12))]

    # nn.silu is compiled once per process: uncompiled, it looks mx.sigmoid up each call
    mx.disable_compile()
    monkeypatch.setattr(mx, "sigmoid", _mlx_own("sigmoid"))
    monkeypatch.setattr(mx, "logsumexp", _mlx_own("logsumexp"))
    monkeypatch.setattr(cpu_exp, "_own", {})
    monkeypatch.delenv("SHOAL_CPU_EXP", raising=False)
    try:
        before = tokens()
        cpu_exp.install()
        assert mx.sigmoid is cpu_exp.sigmoid and mx.logsumexp is cpu_exp.logsumexp
        calls, power = [], mx.power
        monkeypatch.setattr(mx, "power", lambda *a: calls.append(1) or power(*a))
        assert tokens() == before
    finally:
        mx.enable_compile()
    layers = len(model.layers)
    assert len(calls) >= 12 * layers  # every step's gates in every layer, at least


def test_switched_off_by_name(monkeypatch):
    import engine.runtime.cpu_exp as cpu_exp

    monkeypatch.setattr(mx, "sigmoid", _mlx_own("sigmoid"))  # before _own is emptied
    monkeypatch.setattr(cpu_exp, "_own", {})
    monkeypatch.setenv("SHOAL_CPU_EXP", "0")
    cpu_exp.install()
    assert mx.sigmoid is not cpu_exp.sigmoid and not cpu_exp._own
