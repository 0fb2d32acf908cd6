"""A test-only model whose weights force one chosen token sequence, through a real mlx-lm
model class (llama): a random model can't decide to call a tool, this one always does.

How: every transformer block's output projections are zero, so the residual stream at each
position is just the current token's embedding; the output head maps the embedding of each
token of the chain to a large logit for the next one. The chain's pieces are added tokens of
a byte-level tokenizer whose chat template is Qwen-style, so mlx-lm itself picks its
json_tools parser from the template and its <think> tokens turn on reasoning.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tiny import LLAMA, write_byte_tokenizer  # noqa: E402
from tool_template import TEMPLATE  # noqa: E402

CALL = '{"name":"get_weather","arguments":{"city":"Paris"}}'
# what the model says after "<|im_start|>assistant\n", one added token per piece
CHAIN = ["<think>", "Checking.", "</think>", "<tool_call>", CALL, "</tool_call>", "<|im_end|>"]


def make_forcing_model(folder: Path) -> Path:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes as get_model_classes
    from tokenizers import AddedToken, Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    write_byte_tokenizer(folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_tokens([AddedToken(p, special=False, normalized=False)
                    for p in CHAIN if tok.token_to_id(p) is None])
    tok.save(str(folder / "tokenizer.json"))
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = TEMPLATE
    cfg_path.write_text(json.dumps(cfg))

    vocab = tok.get_vocab_size()
    config = {**LLAMA, "vocab_size": vocab}
    model_cls, args_cls = get_model_classes(config)
    mx.random.seed(0)
    model = model_cls(args_cls.from_dict(config))
    w = dict(tree_flatten(model.parameters()))
    for k in w:
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            w[k] = mx.zeros_like(w[k])
    emb = w["model.embed_tokens.weight"]
    ids = [tok.token_to_id("Ċ")] + [tok.token_to_id(p) for p in CHAIN]  # Ċ is "\n"
    head = mx.zeros((vocab, emb.shape[1]))
    for cur, nxt in zip(ids, ids[1:]):
        e = emb[cur]
        head[nxt] = 10.0 * e / mx.linalg.norm(e)
    w["lm_head.weight"] = head
    mx.save_safetensors(str(folder / "model.safetensors"), w)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder
