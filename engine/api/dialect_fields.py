"""The extensions vLLM's and llama.cpp's servers add to OpenAI's chat and completions
bodies, as pydantic mixins both routes' schemas inherit (names, types and defaults as in
vLLM's entrypoints/openai/protocol.py and llama.cpp's tools/server params_from_json_cmpl).

Each field is bounded here, so whatever a client sends is a 400 naming the field before any
of it reaches a worker; what each one does is engine/api/dialect_map.py. Each mixin's
TREATMENT classifies its fields (the convention is in engine/api/openai_schemas.py).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

MAX_TOKENS_LIMIT = 1_000_000  # beyond any context window: a typo, not a request
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]  # the worker checks the vocabulary
Short = Annotated[str, Field(max_length=256)]
Word = Annotated[str, Field(min_length=1, max_length=256)]
MAX_GRAMMAR = 100_000  # characters of a grammar, regex or choice: far past any real one
MAX_IDS = 262_144  # token ids in a list: more than any vocabulary
Choice = Annotated[str, Field(max_length=4096)]


class _Fields(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)


class StructuredOutputs(_Fields):
    """vLLM's structured_outputs (StructuredOutputsParams): one of json, regex, choice,
    grammar or json_object."""
    TREATMENT: ClassVar[dict[str, str]] = {
        "structural_tag": "refused",
        "whitespace_pattern": "refused",
        "disable_any_whitespace": "any value: Shoal's JSON never has free whitespace",
        "disable_additional_properties": "only false: the schema is enforced as given",
        "disable_fallback": "hint"}
    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = Field(default=None, max_length=MAX_GRAMMAR)
    choice: list[Choice] | None = Field(default=None, min_length=1, max_length=1024)
    grammar: str | None = Field(default=None, max_length=MAX_GRAMMAR)
    json_object: bool | None = None
    structural_tag: Any = None
    whitespace_pattern: str | None = Field(default=None, max_length=MAX_GRAMMAR)
    disable_any_whitespace: bool | None = None
    disable_additional_properties: bool | None = None
    disable_fallback: bool | None = None


class VllmFields(_Fields):
    """vLLM's sampling and structured-output extensions, on both routes."""
    TREATMENT: ClassVar[dict[str, str]] = {
        "structural_tag": "refused",
        "guided_whitespace_pattern": "refused",
        "logits_processors": "refused",
        "use_beam_search": "only false: Shoal has no beam search",
        "prompt_logprobs": "on a model held whole by one machine; split over machines, a 400",
        "guided_decoding_backend": "hint",
        "priority": "hint",
        "request_id": "hint",
        "cache_salt": "hint",
        "length_penalty": "hint",  # vLLM uses it in beam search only, which is never on
        "mm_processor_kwargs": "hint",  # for image and audio processors: text only here
        "kv_transfer_params": "hint",  # vLLM's disaggregated serving: one node here
        "vllm_xargs": "hint",  # arguments for custom logits processors, which are refused
        "return_token_ids": "refused",
        "return_tokens_as_token_ids": "with logprobs: tokens spelled token_id:<id>"}
    ignore_eos: bool | None = None
    min_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS_LIMIT)
    stop_token_ids: list[TokenId] | None = Field(default=None, max_length=1024)
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    bad_words: list[Word] | None = Field(default=None, max_length=1024)
    # an empty list would mean "any token" below the API: vLLM refuses it too
    allowed_token_ids: list[TokenId] | None = Field(default=None, min_length=1,
                                                    max_length=MAX_IDS)
    truncate_prompt_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)
    return_tokens_as_token_ids: bool | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = Field(default=None, max_length=MAX_GRAMMAR)
    guided_choice: list[Choice] | None = Field(default=None, min_length=1, max_length=1024)
    guided_grammar: str | None = Field(default=None, max_length=MAX_GRAMMAR)
    structured_outputs: StructuredOutputs | None = None
    structural_tag: Any = None
    guided_decoding_backend: Short | None = None
    guided_whitespace_pattern: str | None = Field(default=None, max_length=MAX_GRAMMAR)
    logits_processors: Any = None  # code to run: never
    use_beam_search: bool | None = None
    priority: int | None = Field(default=None, ge=-(2**31), le=2**31 - 1)
    request_id: Short | None = None
    # Only a hint here: vLLM salts its prefix cache so one tenant can't time another's
    # prompts. A Shoal node has one API key, so every client of it is the same tenant.
    cache_salt: Short | None = None
    length_penalty: float | None = Field(default=None, ge=-100.0, le=100.0)
    mm_processor_kwargs: dict[str, Any] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = Field(default=None, max_length=64)
    return_token_ids: bool | None = None


SamplerName = Annotated[str, Field(min_length=1, max_length=32)]


class LlamaCppFields(_Fields):
    """llama.cpp's server's sampling fields (params_from_json_cmpl), on both routes."""
    TREATMENT: ClassVar[dict[str, str]] = {
        "cache_prompt": "hint",
        "id_slot": "hint",
        "n_keep": "hint",  # Shoal never shifts the context, so nothing is kept or dropped
        "timings_per_token": "hint",
        "return_tokens": "hint",  # llama.cpp itself shows them on /completion only
        "mirostat": "only 0: Shoal has no mirostat sampler",
        "mirostat_tau": "hint",  # no effect with mirostat 0, the only value taken
        "mirostat_eta": "hint",
        "dry_multiplier": "only 0: Shoal has no DRY sampler",
        "dry_base": "hint",  # no effect with dry_multiplier 0, the only value taken
        "dry_allowed_length": "hint",
        "dry_penalty_last_n": "hint",
        "dry_sequence_breakers": "hint",
        "dynatemp_range": "only 0: Shoal has no dynamic temperature",
        "dynatemp_exponent": "hint",
        "top_n_sigma": "only -1 or 0 (off): Shoal has no top-n-sigma sampler",
        "n_indent": "only 0",
        "t_max_predict_ms": "only 0: answers end by tokens, not time",
        "post_sampling_probs": "only false: logprobs are the model's, before sampling",
        "n_cmpl": "only 1",
        "samplers": "llama.cpp's names or letters; dry and top_n_sigma only while off, "
                    "penalties only first",
        "reasoning_format": "only auto or deepseek: reasoning is in reasoning_content",
        "n_cache_reuse": "hint",
        "return_progress": "hint",  # Shoal's own progress comments are in every stream
        "sse_ping_interval": "hint",  # Shoal's keep-alive comes every 10 s of silence
        "response_fields": "hint",  # llama.cpp applies it to /completion only
        "lora": "only []: no adapters are loaded"}
    n_predict: int | None = Field(default=None, ge=-1, le=MAX_TOKENS_LIMIT)
    cache_prompt: bool | None = None
    id_slot: int | None = Field(default=None, ge=-1, le=1_000_000)
    n_probs: int | None = Field(default=None, ge=0, le=20)
    grammar: str | None = Field(default=None, max_length=MAX_GRAMMAR)
    json_schema: dict[str, Any] | None = None
    typical_p: float | None = Field(default=None, gt=0.0, le=1.0)
    typ_p: float | None = Field(default=None, gt=0.0, le=1.0)  # the web UI's name for it
    min_keep: int | None = Field(default=None, ge=0, le=MAX_IDS)
    samplers: list[SamplerName] | Annotated[str, Field(max_length=32)] | None = Field(
        default=None, max_length=32)
    repeat_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    repeat_last_n: int | None = Field(default=None, ge=-1, le=MAX_TOKENS_LIMIT)
    xtc_probability: float | None = Field(default=None, ge=0.0, le=1.0)
    xtc_threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    mirostat: int | None = Field(default=None, ge=0, le=2)
    mirostat_tau: float | None = Field(default=None, ge=0.0, le=100.0)
    mirostat_eta: float | None = Field(default=None, ge=0.0, le=10.0)
    dry_multiplier: float | None = Field(default=None, ge=0.0, le=100.0)
    dry_base: float | None = Field(default=None, ge=0.0, le=100.0)
    dry_allowed_length: int | None = Field(default=None, ge=0, le=MAX_TOKENS_LIMIT)
    dry_penalty_last_n: int | None = Field(default=None, ge=-1, le=MAX_TOKENS_LIMIT)
    dry_sequence_breakers: list[Short] | None = Field(default=None, max_length=64)
    dynatemp_range: float | None = Field(default=None, ge=0.0, le=10.0)
    dynatemp_exponent: float | None = Field(default=None, ge=0.0, le=100.0)
    top_n_sigma: float | None = Field(default=None, ge=-1.0, le=100.0)
    n_keep: int | None = Field(default=None, ge=-1, le=MAX_TOKENS_LIMIT)
    n_indent: int | None = Field(default=None, ge=0, le=MAX_TOKENS_LIMIT)
    t_max_predict_ms: int | None = Field(default=None, ge=0, le=2**31 - 1)
    timings_per_token: bool | None = None
    post_sampling_probs: bool | None = None
    return_tokens: bool | None = None
    n_cmpl: int | None = Field(default=None, ge=1, le=1_000)
    reasoning_format: Short | None = None
    n_cache_reuse: int | None = Field(default=None, ge=0, le=MAX_TOKENS_LIMIT)
    return_progress: bool | None = None
    sse_ping_interval: float | None = Field(default=None, ge=-1.0, le=3600.0)
    response_fields: list[Short] | None = Field(default=None, max_length=64)
    lora: list[dict[str, Any]] | None = Field(default=None, max_length=64)


# field -> (the only value honoured, why); None counts as that value
ONLY: dict[str, tuple[Any, str]] = {
    "mirostat": (0, "Shoal has no mirostat sampler; leave it 0"),
    "dry_multiplier": (0, "Shoal has no DRY sampler; use repeat_penalty or "
                          "frequency_penalty"),
    "dynatemp_range": (0, "Shoal has no dynamic temperature; set temperature"),
    "n_indent": (0, "Shoal doesn't cut answers by indentation; use stop"),
    "t_max_predict_ms": (0, "answers end by tokens here, not by time; use max_tokens"),
    "post_sampling_probs": (False, "logprobs here are the model's, before sampling"),
    "use_beam_search": (False, "Shoal has no beam search"),
    "n_cmpl": (1, "ask again for another answer"),
    "lora": ([], "this node loads no LoRA adapters"),
}

# fields refused whatever their value, and why
REFUSED = {
    "structural_tag": "structural tags aren't supported; use response_format or "
                      "structured_outputs with a JSON schema, regex or grammar",
    "guided_whitespace_pattern": "Shoal's JSON has no free whitespace; leave it out",
    "logits_processors": "a logits processor is code to run on the node, which Shoal "
                         "never takes from a request",
    "return_token_ids": "set logprobs with return_tokens_as_token_ids for the answer's "
                        "ids, or ask /tokenize for the prompt's",
}
