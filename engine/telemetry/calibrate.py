"""A short measurement of this machine as MLX sees it: memory bandwidth (streaming a large
float32 matrix through a matrix-vector product, which is what decoding does), compute
(a large matmul), attention (64 new tokens over 2,048 cached, as a prefill chunk
attends: on a CPU MLX's attention runs at a small fraction of its matmul rate) and the
rate a prefill chunk really gets: one of mlx-lm's Llama decoder layers over 128 tokens,
at widths 512 and 2048, its matmul FLOPs over its time less its attention's (norms,
RoPE, activations and small matmuls make a narrow layer run at a fraction of the large
matmul's rate). Run once in a worker-like subprocess (same BLAS preload) and cached."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from engine.records import SpeedInfo

log = logging.getLogger(__name__)

_MEASURE = r"""
import json, time
import mlx.core as mx
def best(f, n=5):
    f(); ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return min(ts)
w = mx.random.normal((8192, 4096)); x = mx.random.normal((1, 4096)); mx.eval(w, x)
gemv = best(lambda: mx.eval(x @ w.T))
a = mx.random.normal((1024, 1024)); b = mx.random.normal((1024, 1024)); mx.eval(a, b)
gemm = best(lambda: mx.eval(a @ b))
q = mx.random.normal((1, 8, 64, 64)); k = mx.random.normal((1, 8, 2048, 64)); mx.eval(q, k)
sdpa = best(lambda: mx.eval(mx.fast.scaled_dot_product_attention(q, k, k, scale=0.125)))
attention = 4 * 8 * 64 * 2048 * 64 / sdpa
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache
from mlx_lm.models.llama import ModelArgs, TransformerBlock
layer = {}
for h in (512, 2048):
    heads = h // 64
    block = TransformerBlock(ModelArgs(
        model_type="llama", hidden_size=h, num_hidden_layers=1, vocab_size=32,
        intermediate_size=h * 8 // 3 // 64 * 64, num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4), rms_norm_eps=1e-5, head_dim=64))
    mx.eval(block.parameters())
    x = mx.random.normal((1, 128, h)); mx.eval(x)
    t = best(lambda: mx.eval(block(x, "causal", KVCache())))
    params = sum(v.size for _, v in tree_flatten(block.parameters()))
    causal = 4 * heads * 64 * 128 * 64.5 / attention  # each token attends to half the chunk
    layer[str(h)] = 2 * 128 * params / max(t - causal, t / 10)
print(json.dumps({"memory_bandwidth_Bps": w.nbytes / gemv,
                  "compute_flops": 2 * 1024 ** 3 / gemm,
                  "attention_flops": attention,
                  "prefill_flops": layer,
                  "device": str(mx.default_device())}))
"""
VERSION = 2  # a cached measurement of an older version is measured again


def measure(env: dict[str, str] | None = None, timeout: float = 120.0) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", _MEASURE], env=env, capture_output=True,
                         text=True, timeout=timeout, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def calibration(home: Path, key: str) -> SpeedInfo | None:
    """The cached measurement for `key` (machine + MLX version), measuring when missing.
    None (logged) when it can't be measured."""
    from engine.platform.cpu import worker_env
    path = home / "calibration.json"
    try:
        cached = json.loads(path.read_text())
        if cached.get("key") == key:
            return SpeedInfo.from_json(cached)
    except (OSError, ValueError):
        pass
    t0 = time.perf_counter()
    try:
        result = {**measure(worker_env()), "key": key}
    except (subprocess.SubprocessError, OSError, ValueError) as e:
        log.warning("couldn't measure this machine's speed: %s", e)
        return None
    path.write_text(json.dumps(result))
    log.info("measured %.1f GB/s memory bandwidth and %.0f GFLOP/s in %.1f s",
             result["memory_bandwidth_Bps"] / 1e9, result["compute_flops"] / 1e9,
             time.perf_counter() - t0)
    return SpeedInfo.from_json(result)
