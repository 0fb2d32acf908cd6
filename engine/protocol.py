"""The messages between a node and its worker processes, typed, in one module both sides
use (the node's JSON records are in engine/records.py).

On the pipe each message is one JSON line whose "op" (node → worker) or "ev" (worker → node)
names its class; `encode` and `decode` are the only places that spell those names.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NotRequired, TypedDict

from engine.records import LoadReport, TokenLogprob


@dataclass(frozen=True)
class Message:
    tag: ClassVar[str] = ""
    key: ClassVar[str] = "ev"

    def fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


# --- node → worker -------------------------------------------------------------------------
class Constraint(TypedDict, total=False):
    """What the answer must match, exactly one of: a JSON schema, a regular expression, or
    a Lark grammar (llguidance's dialect; GBNF and choices are converted to it by the API),
    compiled to a grammar by llguidance."""
    json_schema: dict[str, Any]
    regex: str
    lark: str
    param: str  # the request's field that asked for it, for the 400 that names it


@dataclass(frozen=True)
class SamplingRequest:
    """What a client asked of the sampler, whatever its protocol; None: the default. The
    worker turns it into engine.runtime.sampling.Sampling once the prompt's length is
    known (max_tokens is capped by what the context has left)."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias)
    logprobs: int | None = None  # None: none; k: the chosen token's and the top k
    constraint: Constraint | None = None
    context_limit: int | None = None  # Ollama's num_ctx: a smaller window than the model's
    speculative: bool | None = None  # None: the node's setting
    draft_tokens: int | None = None  # the most guesses per pass
    # vLLM's and llama.cpp's extensions
    ignore_eos: bool = False  # end-of-sequence can't be sampled: runs to max_tokens
    min_tokens: int = 0  # no stop (token or string) before this many tokens
    stop_token_ids: tuple[int, ...] = ()  # these tokens end the answer, like EOS
    include_stop: bool = False  # include_stop_str_in_output: the stop string is shown
    skip_special: bool = True  # skip_special_tokens: special tokens aren't shown
    spaces_between_special: bool = True  # spaces_between_special_tokens
    bad_words: tuple[str, ...] = ()  # words the answer must never contain
    allowed_token_ids: tuple[int, ...] = ()  # only these may be sampled (empty: any)
    typical_p: float | None = None  # locally typical sampling
    min_keep: int = 0  # llama.cpp: each filter keeps at least this many tokens
    samplers: tuple[str, ...] = ()  # the filters' order (names in SAMPLERS); (): default
    xtc_probability: float = 0.0  # exclude-top-choices (mlx-lm's XTC)
    xtc_threshold: float = 0.1
    repetition_context: int | None = None  # llama.cpp repeat_last_n: the penalties' window
    prompt_logprobs: int | None = None  # the prompt's tokens' logprobs, and the top k
    truncate_prompt_tokens: int | None = None  # keep only the prompt's last k tokens

    @classmethod
    def of(cls, **fields: Any) -> SamplingRequest:
        """From the API's fields (or the pipe's JSON), None meaning the default: lists
        become tuples, and a logit bias keyed by token id strings (as OpenAI sends it)
        becomes pairs."""
        f = {k: v for k, v in fields.items() if v is not None}
        stop = f.get("stop") or ()
        f["stop"] = (stop,) if isinstance(stop, str) else tuple(stop)
        bias = f.get("logit_bias") or ()
        items = bias.items() if isinstance(bias, dict) else bias
        f["logit_bias"] = tuple((int(k), float(v)) for k, v in items)
        for name in ("stop_token_ids", "bad_words", "allowed_token_ids", "samplers"):
            if name in f:
                f[name] = tuple(f[name])
        return cls(**f)


# The filters a `samplers` order may name; temperature is applied where it stands.
SAMPLERS = ("top_k", "typical_p", "top_p", "min_p", "xtc", "temperature")


class TemplateFunction(TypedDict):
    name: str
    arguments: dict[str, Any]  # the call's arguments as an object, as templates read them


class TemplateCall(TypedDict):
    id: NotRequired[str | None]  # Ollama's calls may have none
    type: Literal["function"]
    function: TemplateFunction


class ImageInput(TypedDict):
    """An image a client sent, as the node passes it on: decoded and checked by the API
    (engine/api/images.py: size, pixels, format), then re-encoded as an RGB PNG, so a
    worker never parses a client's bytes. `sha256` is of the decoded pixels and size: the
    prefix cache's key for the image's tokens, so two images never share a cached prefix."""
    data: str  # base64 of the PNG
    sha256: str
    width: int
    height: int


class ContentPart(TypedDict):
    """One piece of a turn that holds images, in order: text, or an image (an index into
    GenerateRequest.images). Chat templates of vision models take a turn's content as these
    parts ({"type": "image"} / {"type": "text", "text": ...})."""
    type: Literal["text", "image"]
    text: NotRequired[str]
    image: NotRequired[int]


class TemplateMessage(TypedDict):
    """One turn as Hugging Face chat templates take it, whatever protocol sent it."""
    role: str  # system | user | assistant | tool
    content: str  # its text (a turn with images: the text parts joined)
    parts: NotRequired[list[ContentPart]]  # only a turn that holds images
    tool_calls: NotRequired[list[TemplateCall]]
    tool_call_id: NotRequired[str | None]  # a tool turn's answer to that call
    name: NotRequired[str]
    reasoning_content: NotRequired[str]


class ToolFunction(TypedDict):
    name: str
    description: NotRequired[str]
    parameters: NotRequired[dict[str, Any]]  # a JSON schema of its arguments
    strict: NotRequired[bool]


class ToolSpec(TypedDict):
    """A tool the model may call, as chat templates take it (OpenAI's function tool)."""
    type: Literal["function"]
    function: ToolFunction


@dataclass(frozen=True)
class GenerateRequest:
    """One generation, whatever protocol asked for it. Either chat `messages` (rendered
    through the model's chat template, with `tools` where given) or a raw `prompt`."""

    messages: list[TemplateMessage] | None = None
    prompt: str | list[int] | None = None
    suffix: str | None = None  # fill-in-the-middle, where the vocabulary has FIM tokens
    tools: list[ToolSpec] | None = None
    tool_choice: str | dict[str, str] = "auto"  # auto | none | required | {"name": ...}
    parallel_tool_calls: bool = True
    thinking: bool | None = None  # the template's thinking switch, where it has one
    sampling: SamplingRequest = field(default_factory=SamplingRequest)
    count_only: bool = False  # just count the prompt's tokens (Anthropic count_tokens)
    continue_final: bool = False  # the last (assistant) message is the answer's beginning
    add_generation_prompt: bool = True  # the template's assistant header after the turns
    documents: list[dict[str, Any]] | None = None  # for templates that take documents (RAG)
    template_kwargs: dict[str, Any] | None = None  # chat_template_kwargs, to the template
    show_prompt: bool = False  # Accepted carries the prompt's text and ids (/tokenize)
    add_special: bool | None = None  # a raw prompt's BOS and the like (None: tokenizer's)
    images: list[ImageInput] | None = None  # what the messages' image parts point at


@dataclass(frozen=True)
class Generate(Message):
    tag = "generate"
    key = "op"
    id: str
    request: GenerateRequest


@dataclass(frozen=True)
class Embed(Message):
    """Embed each input (a text, or token ids): one vector per input, in order. An
    embedding model's worker serves it (Ready.capabilities has "embed")."""
    tag = "embed"
    key = "op"
    id: str
    inputs: list[str | list[int]]
    dimensions: int | None = None  # keep the first N (Matryoshka models), renormalized
    normalize: bool = True  # unit length (cosine similarity is then a dot product)
    truncate: bool = True  # an input longer than the model's context is cut, not refused


@dataclass(frozen=True)
class Rerank(Message):
    """Score each document's relevance to the query, in the documents' order: a reranker
    model's own score, or an embedding model's cosine similarity (Ready.capabilities has
    "rerank")."""
    tag = "rerank"
    key = "op"
    id: str
    query: str
    documents: list[str]
    truncate: bool = True


@dataclass(frozen=True)
class PrefillKV(Message):
    """Run the model over `tokens` and write their KV's frames to the file `path` as each
    layer makes them, which the node passes on as it grows (prefill here, decode on
    another node: engine/runtime/handover.py); Progress as chunks finish, then KVWritten."""
    tag = "prefill_kv"
    key = "op"
    id: str
    tokens: list[int]
    path: str
    job: int = -1  # a group's: the hand-over's number, its ranks' files named by it


@dataclass(frozen=True)
class AdoptKV(Message):
    """Keep the KV of `tokens` whose frames the node writes to `path` as they arrive (read
    until their end, or a Cancel) in the prefix cache, so the request for them decodes at
    once; Progress as chunks arrive, then KVAdopted."""
    tag = "adopt_kv"
    key = "op"
    id: str
    tokens: list[int]
    path: str
    job: int = -1  # a group's: the hand-over's number, whose copy each rank's node wrote


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
class RankReady:
    """What a group rank loaded, in its ready message."""
    rank: int
    world: int
    strategy: str
    layers: list[int]  # [start, end) it holds (every layer for a tensor rank)
    files: list[str]  # the weight files it read
    bytes_read: int
    peak_rss: int
    lanes: int = 1

    def report(self) -> LoadReport:
        """The load report an instance's rank shows (RankInfo.loaded)."""
        return LoadReport(self.files, self.bytes_read, self.peak_rss)


@dataclass(frozen=True)
class Ready(Message):
    tag = "ready"
    model: str
    context_length: int
    pid: int
    load_s: float = 0.0
    streams: int = 1  # the requests it decodes at once
    rank: RankReady | None = None  # a group rank's, what it loaded
    # what the model does: "generate" (text), "vision" (takes images), "embed", "rerank"
    capabilities: list[str] = field(default_factory=lambda: ["generate"])


@dataclass(frozen=True)
class Fatal(Message):
    tag = "fatal"
    code: str | None
    message: str
    rank: int | None = None  # a group's: the rank that failed
    peer: int | None = None  # the rank it lost, where it lost one
    address: str | None = None  # that rank's address


@dataclass(frozen=True)
class Accepted(Message):
    tag = "accepted"
    id: str
    prompt_tokens: int
    prompt_text: str | None = None  # the rendered prompt, when asked for (echo)
    prompt_ids: list[int] | None = None  # its token ids, when asked for (show_prompt)
    # each prompt token's text, or its bytes where they aren't UTF-8 alone (show_prompt:
    # llama.cpp's /tokenize with_pieces, vLLM's token_strs)
    prompt_pieces: list[str | list[int]] | None = None
    # a count-only listing's: the tokens of it the prefix cache holds now (the node asks
    # before it has another node prefill the rest)
    cached: int | None = None


@dataclass(frozen=True)
class Progress(Message):
    """Prefill under way: `done` of the prompt's `total` tokens are in the cache, of which
    `cached` came from the prefix cache (sent when the request is admitted, then as chunks
    finish). A long prefill is work, not silence: the node's watchdog counts it."""

    tag = "progress"
    id: str
    cached: int
    done: int
    total: int


@dataclass(frozen=True)
class Delta(Message):
    """Generated text: `kind` is "content" or "reasoning". `logprobs` holds one entry per
    token generated since the last message."""

    tag = "delta"
    id: str
    text: str
    kind: str = "content"
    logprobs: list[TokenLogprob] | None = None
    generation_tokens: int | None = None  # the answer's tokens so far (continuous usage)


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
    logprobs: list[TokenLogprob] | None = None
    stop_sequence: str | None = None
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    drafted_tokens: int = 0  # speculative decoding: guesses verified
    accepted_tokens: int = 0  # and kept
    prompt_logprobs: list[TokenLogprob | None] | None = None  # the first token's is None


@dataclass(frozen=True)
class Embedded(Message):
    """The answer to Embed: one vector per input, and the tokens the inputs took."""
    tag = "embedded"
    id: str
    vectors: list[list[float]]
    prompt_tokens: int


@dataclass(frozen=True)
class Ranked(Message):
    """The answer to Rerank: one score per document (higher: more relevant)."""
    tag = "ranked"
    id: str
    scores: list[float]
    prompt_tokens: int


@dataclass(frozen=True)
class KVWritten(Message):
    """The answer to PrefillKV: the file's size and how long the prefill took."""
    tag = "kv_written"
    id: str
    bytes: int
    seconds: float


@dataclass(frozen=True)
class KVAdopted(Message):
    """The answer to AdoptKV: the prefix cache holds the KV of `tokens` tokens."""
    tag = "kv_adopted"
    id: str
    tokens: int


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


Event = (Loading | Ready | Fatal | Accepted | Progress | Delta | ToolCall | Done | Embedded
         | Ranked | KVWritten | KVAdopted | Error | Exited)
TERMINAL = (Done, Embedded, Ranked, KVWritten, KVAdopted, Error)
CAPABILITIES = ("generate", "vision", "embed", "rerank")
_CLASSES: dict[tuple[str, str], type[Message]] = {
    (c.key, c.tag): c for c in (Generate, Embed, Rerank, PrefillKV, AdoptKV, Cancel,
                                Shutdown, Loading, Ready, Fatal, Accepted, Progress, Delta,
                                ToolCall, Done, Embedded, Ranked, KVWritten, KVAdopted,
                                Error, Exited)}


def encode(msg: Message) -> bytes:
    """One JSON line for the pipe (a field's dataclasses, however deep, as objects)."""
    return json.dumps({msg.key: msg.tag, **msg.fields()}, separators=(",", ":"),
                      default=_as_object).encode() + b"\n"


def _as_object(v: Any) -> Any:
    if hasattr(v, "to_json"):  # a record spells itself (leaving out its unset optionals)
        return v.to_json()
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return dataclasses.asdict(v)
    raise TypeError(f"{type(v).__name__} can't go on the pipe")


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
        req = dict(raw["request"])
        req["sampling"] = SamplingRequest.of(**(req.get("sampling") or {}))
        raw["request"] = GenerateRequest(**req)
    if cls is Ready and isinstance(raw.get("rank"), dict):
        raw["rank"] = RankReady(**raw["rank"])
    if cls in (Delta, Done) and raw.get("logprobs"):
        raw["logprobs"] = [TokenLogprob.from_json(e) for e in raw["logprobs"]]
    if cls is Done and raw.get("prompt_logprobs"):
        raw["prompt_logprobs"] = [e and TokenLogprob.from_json(e)
                                  for e in raw["prompt_logprobs"]]
    return make(cls, **raw)


def make(cls: type[Message] | str, **fields: Any) -> Message:
    """A message from its fields; names the class doesn't have are dropped (an older or
    newer worker's additions)."""
    if isinstance(cls, str):
        found = _CLASSES.get(("ev", cls)) or _CLASSES.get(("op", cls))
        if found is None:
            raise ValueError(f"unknown message {cls!r}")
        cls = found
    names = {f.name for f in dataclasses.fields(cls)}
    known = {k: v for k, v in fields.items() if k in names}
    try:
        return cls(**known)
    except TypeError as e:
        raise ValueError(f"malformed {cls.tag}: {e}") from None
