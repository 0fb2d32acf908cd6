"""A request's sampling as llama.cpp's completion fields (engine/runtime/llamacpp.py).

Every field is sent, defaults included: llama.cpp's own defaults (temperature 0.8, top_k
40, top_p 0.95, min_p 0.05) are not Shoal's. What llama.cpp can't do is a 400 naming the
field, never dropped. Stop strings, stop token ids, special tokens' display and the end
of the answer stay Shoal's (engine/runtime/stops.py), as on every engine."""

from __future__ import annotations

import json
from typing import Any

from engine.errors import BadRequest
from engine.runtime.sampling import Sampling

# the name each refused field goes by in the 400, and why it can't be served
REFUSED = (
    ("min_tokens", "no stop before a number of tokens"),
    ("bad_words", "words the answer must never contain"),
    ("allowed_token_ids", "a list of the only tokens allowed"),
)
# Shoal's default penalty window (mlx-lm's), where the request names none
WINDOW = 20


def refuse(sampling: Any) -> None:
    """A 400 naming the first field llama.cpp can't honour (of a Sampling or the
    request's SamplingRequest)."""
    for name, what in REFUSED:
        if getattr(sampling, name):
            raise BadRequest(f"'{name}' ({what}) can't be served by this node's llama.cpp "
                             "engine. Leave it out, or serve the model with MLX (launch it "
                             "with \"engine\": \"mlx\").", param=name)


def body(prompt: list[int], sampling: Sampling) -> dict[str, Any]:
    """llama.cpp's /v1/completions body for `prompt` (token ids) as `sampling` asks; its
    stream carries each token's id in its logprobs (so n_probs is at least 1)."""
    refuse(sampling)
    window = WINDOW if sampling.repetition_context is None else sampling.repetition_context
    out: dict[str, Any] = {
        "prompt": prompt, "stream": True, "return_progress": True,
        "n_predict": sampling.max_tokens, "logprobs": max(1, sampling.logprobs or 0),
        "temperature": sampling.temperature, "top_k": sampling.top_k,
        "top_p": sampling.top_p, "min_p": sampling.min_p,
        "typical_p": 1.0 if sampling.typical_p is None else sampling.typical_p,
        "min_keep": sampling.min_keep,
        "repeat_penalty": sampling.repetition_penalty or 1.0,
        "presence_penalty": sampling.presence_penalty or 0.0,
        "frequency_penalty": sampling.frequency_penalty or 0.0,
        "repeat_last_n": window,
        "xtc_probability": sampling.xtc_probability, "xtc_threshold": sampling.xtc_threshold,
        "ignore_eos": sampling.ignore_eos,
        "logit_bias": [[int(t), float(b)] for t, b in sampling.logit_bias],
        "cache_prompt": True, "stop": [], "dry_multiplier": 0.0, "top_n_sigma": -1.0,
        "mirostat": 0,
    }
    if sampling.seed is not None:
        out["seed"] = sampling.seed % (2**32 - 1)  # llama.cpp's is 32 bits; 2^32-1 is random
    if sampling.samplers:  # the request's order; the penalties stay first, as by default
        out["samplers"] = ["penalties", *sampling.samplers]
    if sampling.constraint:
        out["grammar"] = grammar(sampling.constraint)
    return out


def grammar(constraint: Any) -> str:
    """The constraint as llama.cpp's llguidance grammar (the same Lark dialect Shoal's own
    grammar engine compiles: engine/runtime/grammar.py)."""
    if "json_schema" in constraint:
        rule = "%json " + json.dumps(constraint["json_schema"])
    elif "regex" in constraint:
        rule = "/" + constraint["regex"].replace("/", "\\/") + "/"
    elif "lark" in constraint:
        return "%llguidance {}\n" + constraint["lark"]
    else:
        raise BadRequest("The answer's constraint is of a kind this engine doesn't know.",
                         param=constraint.get("param") or "response_format")
    return "%llguidance {}\nstart: " + rule
