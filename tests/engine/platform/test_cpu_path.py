"""The CPU fast path's decisions: OpenBLAS preload in the worker environment, and when
quantized weights are unpacked to float32."""

from __future__ import annotations

import sys

import pytest

from engine.platform import cpu


@pytest.mark.skipif(sys.platform != "linux", reason="the preload is a Linux fix")
def test_worker_env_preloads_system_openblas(monkeypatch):
    monkeypatch.setattr(cpu, "system_openblas", lambda: "/usr/lib/x/libopenblas.so.0")
    monkeypatch.setattr(cpu.gemv, "shim", lambda: "/home/u/.cache/shoal/blas/gemv-1.so")
    env = cpu.worker_env({"PATH": "/bin", "LD_PRELOAD": "/other.so"})
    # the one-row shim goes first: its cblas_sgemm hands everything else to OpenBLAS's
    assert env["LD_PRELOAD"] == \
        "/home/u/.cache/shoal/blas/gemv-1.so:/usr/lib/x/libopenblas.so.0:/other.so"
    assert "OPENBLAS_NUM_THREADS" in env
    assert "LD_PRELOAD" not in cpu.worker_env({"SHOAL_OPENBLAS": "0"})


def test_worker_env_without_openblas_is_unchanged(monkeypatch):
    monkeypatch.setattr(cpu, "system_openblas", lambda: None)
    assert "LD_PRELOAD" not in cpu.worker_env({"PATH": "/bin"})


@pytest.mark.parametrize("fp32,gpu,setting,avail,want", [
    (1_000, False, "auto", 10_000, True),     # fits easily: unpack
    (6_000, False, "auto", 10_000, False),    # more than half the memory: keep 4-bit
    (1_000, True, "auto", 10_000, False),     # GPU kernels are fast: never unpack
    (1_000, False, "auto", None, False),      # unknown memory: be safe
    (6_000, False, "1", 10_000, True),        # forced
    (1_000, False, "0", 10_000, False),
])
def test_should_dequantize(fp32, gpu, setting, avail, want):
    assert cpu.should_dequantize(fp32, gpu, setting, avail) is want


def test_unpacked_model_gives_the_same_tokens(tmp_path, monkeypatch):
    """Unpacking is exact: a 4-bit tiny model greedy-decodes the same tokens either way."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    from engine.runtime.load import cpu_fast_path
    from tiny import make_tiny_model

    monkeypatch.setenv("SHOAL_CPU_DEQUANTIZE", "1")
    model, _ = load(str(make_tiny_model(tmp_path / "m")))
    nn.quantize(model, group_size=32, bits=4)
    prompt = mx.array([1, 2, 3, 4, 5])
    before = [t for t, _ in zip(generate_step(prompt, model), range(12))]
    unpacked = cpu_fast_path(model)
    assert not any(hasattr(m, "bits") for _, m in unpacked.named_modules())
    after = [t for t, _ in zip(generate_step(prompt, unpacked), range(12))]
    assert [t for t, _ in before] == [t for t, _ in after]
