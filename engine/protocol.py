"""The messages between a node and its worker processes, typed, in one module both sides use.

On the pipe each message is one JSON line whose "op" (node → worker) or "ev" (worker → node)
names its class; `encode` and `decode` are the only places that spell those names.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class Message:
    tag: ClassVar[str] = ""
    key: ClassVar[str] = "ev"

    def fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    # Read access by name, for callers that still treat messages as dicts.
    def get(self, name: str, default: Any = None) -> Any:
        if name == self.key:
            return self.tag
        if hasattr(self, name):
            return getattr(self, name)
        return (getattr(self, "extra", None) or {}).get(name, default)

    def __getitem__(self, name: str) -> Any:
        missing = object()
        v = self.get(name, missing)
        if v is missing:
            raise KeyError(name)
        return v


# --- node → worker -------------------------------------------------------------------------
@dataclass(frozen=True)
class GenerateRequest:
    """One generation, whatever protocol asked for it. Either chat `messages` (rendered
    through the model's chat template, with `tools` where given) or a raw `prompt`."""

    messages: list[dict[str, Any]] | None = None
    prompt: str | list[int] | None = None
    suffix: str | None = None  # fill-in-the-middle, where the vocabulary has FIM tokens
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] = "auto"  # auto | none | required | {"name": ...}
    parallel_tool_calls: bool = True
    thinking: bool | None = None  # the template's thinking switch, where it has one
    sampling: dict[str, Any] = field(default_factory=dict)
    count_only: bool = False  # just count the prompt's tokens (Anthropic count_tokens)


@dataclass(frozen=True)
class Generate(Message):
    tag = "generate"
    key = "op"
    id: str
    request: GenerateRequest


@dataclass(frozen=True)
class Cancel(Message):
    tag = "cancel"
    key = "op"
    id: str


@dataclass(frozen=True)
class Shutdown(Message):
    tag = "shutdown"
    key = "op"


# --- worker → node -------------------------------------------------------------------------
@dataclass(frozen=True)
class Loading(Message):
    tag = "loading"
    done: int
    total: int
    rank: int | None = None


@dataclass(frozen=True)
class Ready(Message):
    tag = "ready"
    model: str
    context_length: int
    pid: int
    load_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)  # a group rank's load report


@dataclass(frozen=True)
class Fatal(Message):
    tag = "fatal"
    code: str | None
    message: str
    extra: dict[str, Any] = field(default_factory=dict)  # rank, peer, address


@dataclass(frozen=True)
class Accepted(Message):
    tag = "accepted"
    id: str
    prompt_tokens: int
    prompt_text: str | None = None  # the rendered prompt, when asked for (echo)


@dataclass(frozen=True)
class Delta(Message):
    """Generated text: `kind` is "content" or "reasoning". `logprobs` holds one entry per
    token generated since the last message ({token, logprob, bytes, top_logprobs})."""

    tag = "delta"
    id: str
    text: str
    kind: str = "content"
    logprobs: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class ToolCall(Message):
    tag = "tool_call"
    id: str
    call_id: str
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True)
class Done(Message):
    """The last message of a generation. finish_reason: stop | length | tool_calls |
    cancelled."""

    tag = "done"
    id: str
    finish_reason: str
    prompt_tokens: int
    generation_tokens: int
    prompt_tps: float = 0.0
    generation_tps: float = 0.0
    peak_memory_gb: float = 0.0
    logprobs: list[dict[str, Any]] | None = None
    stop_sequence: str | None = None
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache


@dataclass(frozen=True)
class Error(Message):
    tag = "error"
    id: str
    code: str | None
    message: str
    param: str | None = None
    status: int = 500


@dataclass(frozen=True)
class Exited(Message):
    """Made by the node (not sent by a worker) when a worker process has ended."""

    tag = "exited"
    code: int | None
    reason: str


Event = Loading | Ready | Fatal | Accepted | Delta | ToolCall | Done | Error | Exited
TERMINAL = (Done, Error)
_CLASSES: dict[tuple[str, str], type[Message]] = {
    (c.key, c.tag): c for c in (Generate, Cancel, Shutdown, Loading, Ready, Fatal, Accepted,
                                Delta, ToolCall, Done, Error, Exited)}


def encode(msg: Message) -> bytes:
    """One JSON line for the pipe."""
    body = msg.fields()
    if isinstance(msg, Generate):
        body["request"] = dataclasses.asdict(msg.request)
    return json.dumps({msg.key: msg.tag, **body}, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes | str) -> Message:
    """The message on one line; ValueError for anything that isn't one."""
    raw = json.loads(line)
    if not isinstance(raw, dict):
        raise ValueError("not a message")
    key = "op" if "op" in raw else "ev"
    cls = _CLASSES.get((key, raw.pop(key, None)))
    if cls is None:
        raise ValueError(f"unknown message {raw!r:.80}")
    if cls is Generate:
        raw["request"] = GenerateRequest(**raw["request"])
    return make(cls, **raw)


def make(cls: type[Message] | str, **fields: Any) -> Message:
    """A message from its fields; names the class doesn't have go to its `extra` where it
    has one (and are dropped otherwise: an older or newer peer's additions)."""
    if isinstance(cls, str):
        found = _CLASSES.get(("ev", cls)) or _CLASSES.get(("op", cls))
        if found is None:
            raise ValueError(f"unknown message {cls!r}")
        cls = found
    names = {f.name for f in dataclasses.fields(cls)}
    known = {k: v for k, v in fields.items() if k in names}
    if "extra" in names:
        known["extra"] = {**known.get("extra", {}),
                          **{k: v for k, v in fields.items() if k not in names}}
    try:
        return cls(**known)
    except TypeError as e:
        raise ValueError(f"malformed {cls.tag}: {e}") from None
