"""The request bodies of the embedding routes, as pydantic models: OpenAI's /v1/embeddings
(with vLLM's extensions) and Ollama's /api/embed and /api/embeddings. TREATMENT follows
engine/api/openai_schemas.py's convention. Inputs are bounded here, before any model is
started: a hostile client's million strings are a 400 naming `input`."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StrictBool, StrictInt, field_validator

from engine.api.ollama_schemas import Options
from engine.api.openai_schemas import Strict
from engine.errors import BadRequest

MAX_INPUTS = 2048  # OpenAI's own limit on one request's inputs
MAX_CHARS = 8 * 2**20  # all inputs' characters (or token ids) together
MAX_DIMENSIONS = 65_536
TokenId = Annotated[StrictInt, Field(ge=0, le=2**32 - 1)]
Dimensions = Annotated[StrictInt, Field(ge=1, le=MAX_DIMENSIONS)]
Inputs = list[str | list[int]]


def inputs(v: Any, field: str = "input") -> Inputs:
    """A string, a list of strings, a list of token ids or a list of lists of them, as one
    list of inputs; a BadRequest naming the element that is wrong or the bound passed."""
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v:
        raise BadRequest(f"'{field}' must be a string, a non-empty list of strings, or token "
                         "ids (a list of integers, or a list of such lists).", param=field)
    if all(_is_id(x) for x in v):
        v = [v]  # one input given as its token ids
    if len(v) > MAX_INPUTS:
        raise BadRequest(f"'{field}' has {len(v)} inputs; at most {MAX_INPUTS} go in one "
                         "request: send them in several.", param=field)
    out: Inputs = []
    total = 0
    for i, x in enumerate(v):
        where = f"{field}[{i}]"
        if isinstance(x, str):
            if not x:
                raise BadRequest(f"'{where}' is empty: an input needs some text.",
                                 param=where)
        elif isinstance(x, list) and x and all(_is_id(t) for t in x):
            pass
        else:
            raise BadRequest(f"'{where}' must be a non-empty string or a non-empty list of "
                             "token ids (integers from 0), not mixed.", param=where)
        total += len(x)
        if total > MAX_CHARS:
            raise BadRequest(f"'{field}' holds more than {MAX_CHARS:,} characters (or token "
                             "ids) in all: send them in several requests.", param=field)
        out.append(x)
    if len({type(x) for x in out}) > 1:
        raise BadRequest(f"'{field}' mixes strings and token ids: send one kind.",
                         param=field)
    return out


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**32


class EmbeddingsRequest(Strict):
    """OpenAI's /v1/embeddings, with vLLM's extensions."""
    TREATMENT: ClassVar[dict[str, str]] = {
        "user": "hint", "request_id": "hint", "priority": "hint", "cache_salt": "hint",
        "truncate_prompt_tokens": "only -1 (cut to the model's context, as here by default)",
        "embed_dtype": "float32 and float16 (base64 only)",
        "add_special_tokens": "only true",
        "truncation_side": "only right (the end is cut)",
        "padding": "only do_not_pad",
        "mm_processor_kwargs": "refused"}
    model: str = Field(min_length=1)
    input: str | list[str] | list[TokenId] | list[list[TokenId]]
    dimensions: Dimensions | None = None
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = None
    # vLLM's
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    normalize: bool | None = None  # older vLLM's name for use_activation
    use_activation: bool | None = None
    embed_dtype: Literal["float32", "float16"] = "float32"
    endianness: Literal["native", "little", "big"] = "native"
    add_special_tokens: bool = True
    truncation_side: Literal["left", "right"] | None = None
    padding: Literal["max_length", "do_not_pad"] | None = None
    request_id: str | None = Field(default=None, max_length=256)
    priority: int = Field(default=0, ge=-(2**63), le=2**63 - 1)
    cache_salt: str | None = Field(default=None, max_length=1024)
    mm_processor_kwargs: dict[str, Any] | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _inputs(cls, v: Any) -> Any:
        return inputs(v)

    def check(self) -> None:
        """The values the node can't honour: a 400 naming the field."""
        if self.truncate_prompt_tokens not in (None, -1):
            raise BadRequest("'truncate_prompt_tokens': only -1 is taken (an input longer "
                             "than the model's context is cut to it, as it is by default).",
                             param="truncate_prompt_tokens")
        if not self.add_special_tokens:
            raise BadRequest("'add_special_tokens': only true is taken (the model's special "
                             "tokens are what its embeddings were trained with).",
                             param="add_special_tokens")
        if self.truncation_side == "left":
            raise BadRequest("'truncation_side': only right is taken (an input's end is cut).",
                             param="truncation_side")
        if self.padding == "max_length":
            raise BadRequest("'padding': only do_not_pad is taken.", param="padding")
        if self.mm_processor_kwargs is not None:
            raise BadRequest("'mm_processor_kwargs': this route embeds text only.",
                             param="mm_processor_kwargs")
        if self.normalize is not None and self.use_activation is not None \
                and self.normalize != self.use_activation:
            raise BadRequest("'normalize' and 'use_activation' say different things: send "
                             "one.", param="normalize")

    def normalized(self) -> bool:
        on = self.use_activation if self.use_activation is not None else self.normalize
        return True if on is None else on

    def hints(self) -> list[str]:
        return [f for f in ("user", "request_id", "cache_salt") if getattr(self, f)] + (
            ["priority"] if self.priority else [])


class EmbedOptions(Options):
    """Ollama's options on an embedding request: the generation's knobs have no effect on
    an embedding; num_ctx would change where an input is cut, which is the model's here."""
    TREATMENT: ClassVar[dict[str, str]] = {
        **dict.fromkeys(Options.model_fields, "hint"), "num_ctx": "refused"}


class OllamaCommon(Strict):
    TREATMENT: ClassVar[dict[str, str]] = {}
    model: str = Field(min_length=1)
    options: EmbedOptions | None = None
    keep_alive: float | str | None = None

    def check(self) -> None:
        if self.options is not None and self.options.num_ctx is not None:
            raise BadRequest("'options.num_ctx': an embedding model reads up to its own "
                             "context here; leave num_ctx out.", param="options.num_ctx")

    def hints(self) -> list[str]:
        o = self.options
        return [f"options.{k}" for k in sorted(o.model_fields_set)] if o is not None else []


class OllamaEmbed(OllamaCommon):
    """Ollama's /api/embed."""
    input: str | list[str]
    truncate: StrictBool | None = None  # Ollama's default: true
    dimensions: Dimensions | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _inputs(cls, v: Any) -> Any:
        if v == "" or v == []:
            return []  # loads the model, as Ollama does
        out = inputs(v)
        if any(not isinstance(x, str) for x in out):
            raise BadRequest("'input' must be a string or a list of strings.", param="input")
        return out


class OllamaEmbeddings(OllamaCommon):
    """Ollama's older /api/embeddings: one prompt, its vector as the model gives it."""
    prompt: str | None = None
