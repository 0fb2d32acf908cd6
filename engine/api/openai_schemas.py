"""OpenAI's wire schemas (chat completions and completions) as pydantic models, and the
sampling fields every protocol maps onto. Unknown fields are refused, not dropped: each one a
client may send is either honoured here or listed as harmless (metadata, user, store).

Besides the official SDKs' fields, both routes take vLLM's and llama.cpp's extensions
(engine/api/dialect_fields.py), the de-facto standard of local servers.

Every request schema class says how it treats its fields in a class-level
`TREATMENT: ClassVar[dict[str, str]]` (docs/api.md's field table is generated from it):
- "hint": accepted and logged once (engine/api/hints.py), with no effect on the answer;
- "refused": any value is a 400 naming the field;
- a short sentence: honoured only in part, e.g. "only 1" or "only 0: Shoal has no
  mirostat sampler" (other values are a 400 naming the field);
- a field not in it is honoured.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.api import content, dialect_map
from engine.api.dialect_fields import MAX_TOKENS_LIMIT, LlamaCppFields, VllmFields
from engine.errors import BadRequest
from engine.protocol import Constraint, SamplingRequest

# logit_bias: each key indexes the logits; the worker checks it against the vocabulary
TOKEN_ID = re.compile(r"[0-9]{1,10}")
MAX_BIASED = 1024
TOP_K_LIMIT = 1_000_000  # beyond any vocabulary: keeps every token
Number = float


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Loose(BaseModel):
    """For nested objects whose extra fields only describe (names, ids)."""
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class Drafts(Strict):
    """Shoal's speculative-decoding knobs, the same on every protocol: the answer is the
    same either way, only its speed changes (usage reports drafted/accepted tokens)."""
    speculative: bool | None = None  # None: as the node is set
    draft_tokens: int | None = Field(default=None, ge=1, le=16)

    def drafts(self) -> dict[str, bool | int | None]:
        """The knobs as SamplingRequest's fields (None: as the node is set)."""
        return {"speculative": self.speculative, "draft_tokens": self.draft_tokens}


class SamplingFields(Drafts):
    TREATMENT: ClassVar[dict[str, str]] = {
        "seed": "-1 is a fresh random seed each time, as llama.cpp's server takes it"}
    temperature: Number | None = Field(default=None, ge=0.0, le=2.0)
    top_p: Number | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0, le=TOP_K_LIMIT)
    min_p: Number | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: Number | None = Field(default=None, gt=0.0, le=10.0)
    presence_penalty: Number | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Number | None = Field(default=None, ge=-2.0, le=2.0)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: str | list[str] | None = None
    logit_bias: dict[str, Number] | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: Any) -> Any:
        if isinstance(v, list) and len(v) > 16:
            raise ValueError("at most 16 stop strings")
        return v

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _pairs(cls, v: Any) -> Any:
        """llama.cpp's form, [[token id, bias or false], ...], as OpenAI's object (false:
        never, as -100 is); its text keys need the tokenizer, so they are refused."""
        if not isinstance(v, list):
            return v
        if len(v) > MAX_BIASED:
            raise ValueError(f"at most {MAX_BIASED} token ids may be biased, got {len(v)}")
        out: dict[str, Any] = {}
        for pair in v:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise ValueError("llama.cpp's form is a list of [token id, bias] pairs")
            tid, bias = pair
            if isinstance(tid, str):
                raise ValueError("text keys aren't taken here; give token ids (POST "
                                 "/tokenize gives them)")
            if isinstance(tid, bool) or not isinstance(tid, int) or not 0 <= tid < 2**31:
                raise ValueError(f"token ids are whole numbers from 0, got {tid!r}")
            out[str(tid)] = -100.0 if bias is False else bias
        return out

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is not None and len(v) > MAX_BIASED:
            raise ValueError(f"at most {MAX_BIASED} token ids may be biased, got {len(v)}")
        for k, b in (v or {}).items():
            if not TOKEN_ID.fullmatch(k):  # not str.isdigit(): "²" and "٣" are digits too
                raise ValueError("keys are token ids, whole numbers written in the digits "
                                 f"0-9 (at most 10), got {k!r}")
            if not -100 <= b <= 100:
                raise ValueError(f"biases are between -100 and 100, got {b}")
        seen: dict[int, str] = {}
        for k in v or {}:  # "7" and "007" would bias the same token twice
            if int(k) in seen:
                raise ValueError(f"token id {int(k)} is given twice ({seen[int(k)]!r} and "
                                 f"{k!r})")
            seen[int(k)] = k
        return v

    def sampling(self, max_tokens: int | None, logprobs: int | None = None,
                 constraint: Constraint | None = None) -> SamplingRequest:
        """The sampler's request, with vLLM's and llama.cpp's extensions where the body
        has them (engine/api/dialect_map.py)."""
        return SamplingRequest.of(
            max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
            top_k=self.top_k, min_p=self.min_p, stop=self.stop,
            seed=None if self.seed == -1 else self.seed,
            logit_bias=self.logit_bias, logprobs=logprobs, constraint=constraint,
            **dialect_map.penalties(self), **dialect_map.extensions(self), **self.drafts())


class FunctionDef(Strict):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedChoice(Strict):
    class Fn(Strict):
        name: str

    type: Literal["function"]
    function: Fn


class FunctionCall(Loose):
    name: str
    arguments: str


class ToolCallIn(Loose):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Part(Loose):
    """A content part: text, or an image_url ({url, detail}); engine/api/content.py reads
    it."""
    type: str
    text: str | None = None


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Part] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    refusal: str | None = None


class JsonSchemaSpec(Strict):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


CHAT_HINTS = ("user", "metadata", "store", "service_tier", "safety_identifier",
              "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention",
              "verbosity", "prediction", "moderation")


class StreamOptions(Strict):
    TREATMENT: ClassVar[dict[str, str]] = {"include_obfuscation": "hint"}
    include_usage: bool | None = None
    include_obfuscation: bool | None = None
    continuous_usage_stats: bool | None = None  # vLLM's: usage on every chunk


def treatment(*parts: type, **own: str) -> dict[str, str]:
    """A request class's TREATMENT: its parts' and its own."""
    out: dict[str, str] = {}
    for p in parts:
        out.update(getattr(p, "TREATMENT", {}))
    return {**out, **own}


class ChatCompletionRequest(SamplingFields, VllmFields, LlamaCppFields):
    TREATMENT: ClassVar[dict[str, str]] = treatment(
        VllmFields, LlamaCppFields, **dict.fromkeys(CHAT_HINTS, "hint"),
        n="only 1", audio="refused", functions="refused", function_call="refused",
        web_search_options="refused", chat_template="refused",
        modalities="only [\"text\"]",
        add_special_tokens="only false: the chat template places the special tokens")
    model: str | None = Field(default=None, min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    max_tokens: int | None = Field(default=None, ge=-1, le=MAX_TOKENS_LIMIT)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's chat extensions
    echo: bool | None = None  # the final assistant message begins the answer shown
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    documents: list[dict[str, Any]] | None = Field(default=None, max_length=256)
    chat_template: str | None = None  # refused: a template is code
    add_special_tokens: bool | None = None
    include_reasoning: bool | None = None  # false: the reasoning is left out
    # Harmless: bookkeeping a local server has no use for.
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    prompt_cache_retention: str | None = None
    modalities: list[Literal["text"]] | None = None  # text is all there is
    verbosity: Literal["low", "medium", "high"] | None = None  # a hint to the model
    prediction: dict[str, Any] | None = None  # predicted output: speed, not the answer
    moderation: Any = None
    # refused when given (to_request says why)
    audio: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    web_search_options: Any = None

    def hints(self) -> list[str]:
        """The bookkeeping and hint fields this request carries (accepted, not used)."""
        parts = [p.model_dump() for m in self.messages if isinstance(m.content, list)
                 for p in m.content]
        return dialect_map.hints_of(self, self.TREATMENT) + content.image_hints(parts)


def constraint_of(fmt: ResponseFormat | None) -> Constraint | None:
    """The grammar constraint for a response_format (None for text)."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"json_schema": {"type": "object"}}
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise BadRequest("'response_format.json_schema.schema' is required for json_schema.",
                         param="response_format.json_schema.schema")
    return {"json_schema": fmt.json_schema.schema_}


def choose_tool(tools: list[Tool] | None, choice: Any) -> str | dict[str, str]:
    """tool_choice as the worker takes it: auto | none | required | {"name": ...}."""
    if choice is None:
        return "auto"
    if isinstance(choice, NamedChoice):
        names = [t.function.name for t in tools or []]
        if choice.function.name not in names:
            raise BadRequest(f"'tool_choice' names {choice.function.name!r}, which is not "
                             f"among the tools ({', '.join(names) or 'none given'}).",
                             param="tool_choice")
        return {"name": choice.function.name}
    if choice in ("required",) and not tools:
        raise BadRequest("'tool_choice' is 'required' but no tools were given.",
                         param="tool_choice")
    return str(choice)
