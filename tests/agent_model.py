"""A test-only model for driving real coding agents: it calls the agent's tool on the first
turn and, once a tool's result is in the conversation, answers with a fixed reply. Real
mlx-lm llama weights (one layer of width 64, one attention head) over SmolLM2's own
tokenizer, so agents' 10-20K-token prompts prefill in a fraction of a second and fit its
declared 131072-token context.

How it decides, with no training:
- every token's embedding has a constant 1 in dimension 0 and a random rest; only the
  `</tool_response>` marker has a 1 in dimension 1;
- the attention head queries dimension 0 (the same query everywhere) against
  keys of dimension 1, in RoPE's slowest pair, so every position that follows a marker
  attends to it; its value (dimension 1 again) is written into dimension 2 of the residual;
- the MLP is zero, so the final state is the current token's embedding
  plus "a tool result was seen", and the head maps each (token, seen) state of the two
  chains to the chain's next token with a large logit.
The chat template is Qwen-style with <tool_call> JSON, so mlx-lm picks its json_tools
parser from it, as it does for real models.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tool_template import TEMPLATE

WIDTH = 64
MARKER = "</tool_response>"
REPLY = "shoal-agent-done"
CALL_ARGS = {  # what each agent's tool is called with
    "claude": {"name": "Bash", "arguments": {"command": "echo shoal-tool-ok",
                                             "description": "Print a marker"}},
    "codex": {"name": "exec_command", "arguments": {"cmd": "echo shoal-tool-ok"}},
    "opencode": {"name": "bash", "arguments": {"command": "echo shoal-tool-ok",
                                               "description": "Print a marker"}},
    "continue": {"name": "Bash", "arguments": {"command": "echo shoal-tool-ok"}},
}


def make_agent_model(folder: Path, tokenizer_from: Path, agent: str) -> Path:
    """A model folder that calls `agent`'s shell tool, then answers REPLY."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes
    from tokenizers import AddedToken, Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_from / name, folder / name)
    call = json.dumps(CALL_ARGS[agent], separators=(",", ":"))
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    pieces = ["<tool_call>", "</tool_call>", "<tool_response>", MARKER, call, REPLY]
    tok.add_tokens([AddedToken(p, special=False, normalized=False) for p in pieces])
    tok.save(str(folder / "tokenizer.json"))
    tc = json.loads((folder / "tokenizer_config.json").read_text())
    tc["chat_template"] = TEMPLATE
    tc["model_max_length"] = 131072
    (folder / "tokenizer_config.json").write_text(json.dumps(tc))
    ids = {p: tok.token_to_id(p) for p in [*pieces, "<|im_end|>", "Ċ"]}

    vocab = -(-tok.get_vocab_size() // 64) * 64
    config: dict[str, Any] = {
        "model_type": "llama", "hidden_size": WIDTH, "num_hidden_layers": 1,
        "intermediate_size": 128, "num_attention_heads": 1, "num_key_value_heads": 1,
        "rms_norm_eps": 1e-5, "rope_theta": 1e10, "max_position_embeddings": 131072,
        "tie_word_embeddings": False, "vocab_size": vocab, "eos_token_id": [ids["<|im_end|>"]]}
    cls, args = _get_classes(config)
    mx.random.seed(0)
    model = cls(args.from_dict(config))
    w = dict(tree_flatten(model.parameters()))
    for k in list(w):
        if k.endswith(("o_proj.weight", "down_proj.weight", "q_proj.weight", "k_proj.weight",
                       "v_proj.weight")):
            w[k] = mx.zeros_like(w[k])
        elif k.endswith("norm.weight"):
            w[k] = mx.ones_like(w[k])
    emb = mx.random.normal((vocab, WIDTH))
    emb[:, :3] = 0.0
    emb[:, 0] = 1.0
    emb[ids[MARKER], 1] = 1.0
    w["model.embed_tokens.weight"] = emb
    half = WIDTH // 2  # one head of 64: RoPE pairs (i, i + 32); pair 31 turns slowest
    q = mx.zeros((WIDTH, WIDTH))
    q[half - 1, 0] = 24.0  # q.k / sqrt(64) = 72 at the marker: all weight on it
    k = mx.zeros((WIDTH, WIDTH))
    k[half - 1, 1] = 24.0
    v = mx.zeros((WIDTH, WIDTH))
    v[0, 1] = 1.0
    o = mx.zeros((WIDTH, WIDTH))
    o[2, 0] = float(mx.linalg.norm(emb[ids["Ċ"]]).item())  # "seen" as long as a token
    w["model.layers.0.self_attn.q_proj.weight"] = q
    w["model.layers.0.self_attn.k_proj.weight"] = k
    w["model.layers.0.self_attn.v_proj.weight"] = v
    w["model.layers.0.self_attn.o_proj.weight"] = o
    seen = mx.zeros((WIDTH,))
    seen[2] = o[2, 0]
    head = mx.zeros((vocab, WIDTH))
    chains = [(False, ["Ċ", "<tool_call>", call, "</tool_call>", "<|im_end|>"]),
              (True, ["Ċ", REPLY, "<|im_end|>"])]
    for after_result, chain in chains:
        for cur, nxt in zip(chain, chain[1:]):
            state = emb[ids[cur]] + (seen if after_result else 0.0)
            head[ids[nxt]] += 10.0 * state / mx.linalg.norm(state)
    w["lm_head.weight"] = head
    mx.save_safetensors(str(folder / "model.safetensors"), w)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder
