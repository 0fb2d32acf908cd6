"""What names a conversation across its turns, for choosing the replica whose cache holds
its start (engine/node/routing.py): computed from the request every protocol maps to, so
an Anthropic, OpenAI or Ollama client's conversation lands where its turns went before."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from engine import protocol as wire

KEY_CHARS = 4096  # of a raw prompt: its start names the conversation


def conversation_key(req: wire.GenerateRequest) -> str | None:
    """What names a conversation across its turns: its system turns, its tools and its
    first other turn (an agent's first message), or a raw prompt's start. None for a
    request with neither."""
    head: list[Any] = []
    if req.messages:
        for m in req.messages:
            head.append(_plain(m))
            if m.get("role") not in ("system", "developer"):
                break
    elif isinstance(req.prompt, str):
        head.append(req.prompt[:KEY_CHARS])
    elif isinstance(req.prompt, list):
        head.append(req.prompt[:KEY_CHARS // 4])
    else:
        return None
    head.append([_plain(t) for t in req.tools or []])
    raw = json.dumps(head, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(raw.encode()).hexdigest()


def _plain(x: Any) -> Any:
    """A message or tool as JSON-able data (pydantic model, dataclass or plain)."""
    if hasattr(x, "model_dump"):
        return x.model_dump(mode="json")
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.asdict(x)
    return x
