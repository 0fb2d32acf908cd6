"""RoPE scaling that GGUF files store as tensors, turned back into config.json's rope_scaling.

llama.cpp keeps Llama 3.1+'s per-frequency factors as `rope_freqs.weight` and Phi-3's
LongRoPE factors as `rope_factors_long/short.weight`; mlx-lm wants them in the config.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import UnsupportedModel
from engine.hub.gguf_reader import GGUFHeader, TensorInfo

ROPE_FREQS = "rope_freqs.weight"  # Llama 3.1+ per-frequency RoPE factors
ROPE_LONG, ROPE_SHORT = "rope_factors_long.weight", "rope_factors_short.weight"  # Phi-3


def read_factors(header: GGUFHeader, name: str, count: int) -> np.ndarray:
    """A small F32 tensor of RoPE factors, as float64, checked for its length."""
    t: TensorInfo = next(t for t in header.tensors if t.name == name)
    if t.type_name != "F32" or t.n_elements != count:
        raise UnsupportedModel(f"{header.path.name} has {t.type_name} {name} with "
                               f"{t.n_elements} values; Shoal expects {count} F32 ones.")
    return np.fromfile(header.path, dtype="<f4", count=count,
                       offset=header.data_offset + t.offset).astype(np.float64)


def llama3_rope_scaling(header: GGUFHeader, base: float, dims: int) -> dict[str, Any]:
    """Recover Llama 3's rope_scaling from the per-frequency factors llama.cpp stores.

    mlx-lm rebuilds the factors from (factor, low/high_freq_factor, original context);
    only their ratios matter, so the original context is fixed at 8192 and the two
    frequency factors are fitted on the smoothly scaled band, then checked on all."""
    ff = read_factors(header, ROPE_FREQS, dims // 2)
    factor, context = float(ff.max()), 8192
    inv_wavelen = 1 / (2 * np.pi * base ** (np.arange(0, dims, 2) / dims))
    low, high = 1.0, 4.0  # Meta's values, used when the band has under two points
    band = (ff > 1 + 1e-4) & (ff < factor * (1 - 1e-4))
    if factor > 1 and band.sum() >= 2:
        smooth = (1 / ff[band] - 1 / factor) / (1 - 1 / factor)  # = (ctx/wl - low)/(high-low)
        slope, intercept = np.polyfit(inv_wavelen[band], smooth, 1)
        low = -intercept * context / slope
        high = low + context / slope
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": float(low),
               "high_freq_factor": float(high), "original_max_position_embeddings": context}
    if factor <= 1 or not np.allclose(llama3_factors(scaling, inv_wavelen), ff, rtol=1e-3):
        raise UnsupportedModel(f"{header.path.name} has RoPE frequency factors that don't "
                               f"follow Llama 3's rule; Shoal can't map them to mlx-lm.")
    return scaling


def llama3_factors(scaling: dict[str, Any], inv_wavelen: Any) -> Any:
    """The per-frequency factors mlx-lm's Llama3RoPE applies (as in rope_utils.py)."""
    ctx, factor = scaling["original_max_position_embeddings"], scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wl = 1 / inv_wavelen
    smooth = (ctx / wl - low) / (high - low)
    medium = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wl > ctx / low, factor, np.where(wl < ctx / high, 1.0, medium))


def phi3_longrope(header: GGUFHeader, rope_dims: int) -> dict[str, Any]:
    """Phi-3's LongRoPE: both factor lists as HF's rope_scaling {"type": "longrope"}.

    mlx-lm's SuScaledRoPE applies the long factors (and the attention scale it derives
    from the context lengths) at every length; llama.cpp switches to the short ones for
    contexts within the original length. Outputs agree only where the two lists do."""
    names = {t.name for t in header.tensors}
    if ROPE_LONG not in names or ROPE_SHORT not in names:
        raise UnsupportedModel(f"{header.path.name} has only one of {ROPE_LONG} and "
                               f"{ROPE_SHORT}; Phi-3's LongRoPE needs both.")
    long = read_factors(header, ROPE_LONG, rope_dims // 2)
    short = read_factors(header, ROPE_SHORT, rope_dims // 2)
    return {"type": "longrope", "long_factor": [float(x) for x in long],
            "short_factor": [float(x) for x in short]}
