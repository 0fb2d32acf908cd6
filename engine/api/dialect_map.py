"""What vLLM's and llama.cpp's extension fields (engine/api/dialect_fields.py) mean here:
the SamplingRequest fields they set, the one grammar constraint a request may carry, the
400s naming a field whose value can't be honoured, and the hints a request carries."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from engine.api.dialect_fields import MAX_TOKENS_LIMIT, ONLY, REFUSED
from engine.errors import BadRequest
from engine.protocol import SAMPLERS, Constraint

# llama.cpp's sampler names (with its alternative spellings) and letters, as SAMPLERS
# names them; the rest are llama.cpp samplers Shoal takes only where they do nothing.
SAMPLER_NAMES = {"top_k": "top_k", "top-k": "top_k", "typ_p": "typical_p",
                 "typical_p": "typical_p", "typical-p": "typical_p", "typ-p": "typical_p",
                 "typical": "typical_p", "typ": "typical_p", "top_p": "top_p",
                 "top-p": "top_p", "nucleus": "top_p", "min_p": "min_p", "min-p": "min_p",
                 "xtc": "xtc", "temperature": "temperature", "temp": "temperature",
                 "penalties": "penalties", "dry": "dry", "top_n_sigma": "top_n_sigma",
                 "top-n-sigma": "top_n_sigma", "infill": "infill", "adaptive_p": "adaptive_p"}
SAMPLER_LETTERS = {"k": "top_k", "y": "typical_p", "p": "top_p", "m": "min_p", "x": "xtc",
                   "t": "temperature", "e": "penalties", "d": "dry", "s": "top_n_sigma",
                   "i": "infill", "a": "adaptive_p"}

# The fields that each make the answer match a grammar: a request may give one.
STRUCTURED = ("response_format", "guided_json", "guided_regex", "guided_choice",
              "guided_grammar", "structured_outputs", "grammar", "json_schema")
# chat_template_kwargs keys that are apply_chat_template's own arguments, not the
# template's: chat_template among them would run a client's template, which is code.
TEMPLATE_ARGUMENTS = {"chat_template", "tokenize", "return_dict", "return_tensors",
                      "padding", "truncation", "max_length", "tools", "documents",
                      "add_generation_prompt", "continue_final_message", "conversation",
                      "messages", "tokenizer_kwargs", "return_assistant_tokens_mask"}
REASONING_FORMATS = ("auto", "deepseek")


def _given(body: BaseModel, name: str) -> Any:
    v = getattr(body, name, None)
    if name == "grammar" and isinstance(v, str) and not v.strip():
        return None  # llama.cpp's clients send "" for no grammar, as its server takes it
    return v


def check(body: BaseModel) -> None:
    """A BadRequest naming the first field given a value Shoal can't honour."""
    for name, why in REFUSED.items():
        if _given(body, name) is not None:
            raise BadRequest(f"'{name}' can't be served here: {why}.", param=name)
    for name, (only, why) in ONLY.items():
        v = _given(body, name)
        if v is not None and v != only:
            raise BadRequest(f"'{name}' can only be {json.dumps(only)} here ({why}); got "
                             f"{json.dumps(v)}.", param=name)
    sigma = _given(body, "top_n_sigma")
    if sigma is not None and sigma > 0:
        raise BadRequest("'top_n_sigma' can only be -1 or 0 (off) here: Shoal has no "
                         "top-n-sigma sampler; use top_k or min_p.", param="top_n_sigma")
    fmt = _given(body, "reasoning_format")
    if fmt is not None and fmt not in REASONING_FORMATS:
        raise BadRequest(f"'reasoning_format' can only be auto or deepseek here: reasoning "
                         f"is always in reasoning_content; got {fmt!r}.",
                         param="reasoning_format")


def typical_of(body: BaseModel) -> float | None:
    """typical_p, or typ_p (the name llama.cpp's web UI sends for it)."""
    typical, typ = _given(body, "typical_p"), _given(body, "typ_p")
    if typical is not None and typ is not None and typical != typ:
        raise BadRequest(f"'typ_p' ({typ}) and 'typical_p' ({typical}) are the same setting "
                         "and differ: send one.", param="typ_p")
    return typical if typical is not None else typ


def max_tokens_of(body: BaseModel, *names: str) -> int | None:
    """The answer's token limit: the first of OpenAI's `names` given, or llama.cpp's
    n_predict (-1: none); n_predict different from OpenAI's field is a 400."""
    def limit(n: str) -> int | None:  # -1: no limit, as llama.cpp's server takes it
        v = _given(body, n)
        return None if v == -1 else v
    name = next((n for n in names if _given(body, n) is not None), None)
    if _given(body, "n_predict") is None:
        return limit(name) if name else None
    n_predict = limit("n_predict")
    if name and limit(name) != n_predict:
        raise BadRequest(f"'{name}' ({_given(body, name)}) and 'n_predict' "
                         f"({_given(body, 'n_predict')}) both set the answer's length and "
                         "differ: send one.", param="n_predict")
    return n_predict


def samplers_of(body: BaseModel) -> tuple[str, ...]:
    """llama.cpp's `samplers` (names, or one letter each) as SAMPLERS names, in order.
    Its penalties stage is where Shoal applies penalties anyway (first); its DRY and
    top-n-sigma stages are dropped only while their parameters turn them off."""
    raw = _given(body, "samplers")
    if raw is None:
        return ()
    if isinstance(raw, str):
        bad = [c for c in raw if c not in SAMPLER_LETTERS]
        if bad:
            raise BadRequest(f"'samplers': {bad[0]!r} is not one of llama.cpp's sampler "
                             f"letters ({''.join(SAMPLER_LETTERS)}).", param="samplers")
        names = [SAMPLER_LETTERS[c] for c in raw]
    else:
        bad = [n for n in raw if n not in SAMPLER_NAMES]
        if bad:
            raise BadRequest(f"'samplers': {bad[0]!r} is not a sampler Shoal knows "
                             f"({', '.join(SAMPLERS)}).", param="samplers")
        names = [SAMPLER_NAMES[n] for n in raw]
    out: list[str] = []
    for n in names:
        if n == "penalties" and out:
            raise BadRequest("'samplers': Shoal applies the penalties first, before every "
                             "filter; put 'penalties' first or leave it out.",
                             param="samplers")
        off = n == "penalties" or (n == "dry" and not _given(body, "dry_multiplier")) or \
            (n == "top_n_sigma" and (_given(body, "top_n_sigma") or -1) <= 0)
        if off:
            continue
        if n not in SAMPLERS:
            raise BadRequest(f"'samplers': Shoal has no {n!r} sampler (it takes "
                             f"{', '.join(SAMPLERS)}).", param="samplers")
        if n in out:
            raise BadRequest(f"'samplers': {n!r} is named twice; name each once.",
                             param="samplers")
        out.append(n)
    if not out:
        raise BadRequest(f"'samplers' names no sampler Shoal applies; name some of "
                         f"{', '.join(SAMPLERS)} or leave it out.", param="samplers")
    return tuple(out)


def _schema(v: dict[str, Any] | str, param: str) -> dict[str, Any]:
    if isinstance(v, dict):
        return v
    try:
        schema = json.loads(v)
    except ValueError as e:
        raise BadRequest(f"'{param}' is not a JSON schema: {e}.", param=param) from None
    if not isinstance(schema, dict):
        raise BadRequest(f"'{param}' must be a JSON schema (an object).", param=param)
    return schema


def gbnf_lark(text: str, param: str) -> str:
    """A GBNF grammar (llama.cpp's) or a Lark one, as llguidance's Lark."""
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        return any_to_lark(text)
    except RecursionError:
        raise BadRequest(f"'{param}': the grammar nests too deeply.", param=param) from None
    except Exception as e:  # the converter's errors say where the grammar is wrong
        raise BadRequest(f"'{param}' is not a grammar Shoal can read (GBNF or Lark): {e}",
                         param=param) from None


def choice_lark(choices: list[str]) -> str:
    """A Lark grammar whose only sentences are the choices (JSON strings are Lark's)."""
    return "start: " + " | ".join(json.dumps(c) for c in choices)


def structured(body: BaseModel, response_format: Constraint | None) -> Constraint | None:
    """The grammar the answer must match, from whichever one field asked for it."""
    given = [n for n in STRUCTURED if _given(body, n) is not None
             and (n != "response_format" or response_format is not None)]
    if len(given) > 1:
        raise BadRequest(f"'{given[0]}' and '{given[1]}' both constrain the answer; send "
                         "one.", param=given[1])
    if not given:
        return None
    name = given[0]
    v = _given(body, name)
    if name == "response_format":
        assert response_format is not None
        return {**response_format, "param": name}
    if name in ("guided_json", "json_schema"):
        return {"json_schema": _schema(v, name), "param": name}
    if name == "guided_regex":
        return {"regex": v, "param": name}
    if name == "guided_choice":
        return {"lark": choice_lark(v), "param": name}
    if name in ("guided_grammar", "grammar"):
        return {"lark": gbnf_lark(v, name), "param": name}
    return _structured_outputs(v)


def _structured_outputs(so: Any) -> Constraint:
    if so.structural_tag is not None:
        raise BadRequest("'structured_outputs.structural_tag': structural tags aren't "
                         "supported; use json, regex, choice or grammar.",
                         param="structured_outputs.structural_tag")
    if so.whitespace_pattern is not None:
        raise BadRequest("'structured_outputs.whitespace_pattern': Shoal's JSON has no "
                         "free whitespace; leave it out.",
                         param="structured_outputs.whitespace_pattern")
    if so.disable_additional_properties:
        raise BadRequest("'structured_outputs.disable_additional_properties': the schema "
                         "is enforced as given; set additionalProperties in it instead.",
                         param="structured_outputs.disable_additional_properties")
    kinds = [k for k in ("json", "regex", "choice", "grammar", "json_object")
             if getattr(so, "json_" if k == "json" else k) not in (None, False)]
    if len(kinds) != 1:
        raise BadRequest("'structured_outputs' takes exactly one of json, regex, choice, "
                         f"grammar or json_object (got {', '.join(kinds) or 'none'}).",
                         param="structured_outputs")
    param = f"structured_outputs.{kinds[0]}"
    if kinds[0] == "json":
        return {"json_schema": _schema(so.json_, param), "param": param}
    if kinds[0] == "json_object":
        return {"json_schema": {"type": "object"}, "param": param}
    if kinds[0] == "regex":
        return {"regex": so.regex, "param": param}
    if kinds[0] == "choice":
        return {"lark": choice_lark(so.choice), "param": param}
    return {"lark": gbnf_lark(so.grammar, param), "param": param}


def extensions(body: BaseModel) -> dict[str, Any]:
    """The SamplingRequest fields vLLM's and llama.cpp's extensions set (None: default)."""
    f: dict[str, Any] = {
        "ignore_eos": _given(body, "ignore_eos"), "min_tokens": _given(body, "min_tokens"),
        "stop_token_ids": _given(body, "stop_token_ids"),
        "include_stop": _given(body, "include_stop_str_in_output"),
        "skip_special": _given(body, "skip_special_tokens"),
        "spaces_between_special": _given(body, "spaces_between_special_tokens"),
        "bad_words": _given(body, "bad_words"),
        "allowed_token_ids": _given(body, "allowed_token_ids"),
        "truncate_prompt_tokens": _given(body, "truncate_prompt_tokens"),
        "prompt_logprobs": _given(body, "prompt_logprobs"),
        "typical_p": typical_of(body), "min_keep": _given(body, "min_keep"),
        "samplers": samplers_of(body) or None,
        "xtc_probability": _given(body, "xtc_probability"),
        "xtc_threshold": _given(body, "xtc_threshold")}
    last_n = _given(body, "repeat_last_n")
    if last_n is not None and last_n != 0:  # 0 turns the penalties off: penalties() says
        f["repetition_context"] = MAX_TOKENS_LIMIT if last_n == -1 else last_n
    return {k: v for k, v in f.items() if v is not None}


def penalties(body: BaseModel) -> dict[str, Any]:
    """repetition/presence/frequency penalties, with llama.cpp's repeat_penalty as
    repetition_penalty (two different values: a 400) and repeat_last_n 0 turning all
    three off, as llama.cpp's does."""
    rep, alias = _given(body, "repetition_penalty"), _given(body, "repeat_penalty")
    if rep is not None and alias is not None and rep != alias:
        raise BadRequest(f"'repetition_penalty' ({rep}) and 'repeat_penalty' ({alias}) "
                         "are the same setting and differ: send one.",
                         param="repeat_penalty")
    out = {"repetition_penalty": rep if rep is not None else alias,
           "presence_penalty": _given(body, "presence_penalty"),
           "frequency_penalty": _given(body, "frequency_penalty")}
    if _given(body, "repeat_last_n") == 0:
        return {k: None for k in out}
    return out


def template_kwargs(kwargs: dict[str, Any] | None) -> tuple[bool | None, dict[str, Any]]:
    """chat_template_kwargs: (enable_thinking, the rest for the template). Keys that are
    apply_chat_template's own arguments are a 400 (chat_template would run a client's
    template)."""
    kw = dict(kwargs or {})
    think = kw.pop("enable_thinking", None)
    if think is not None and not isinstance(think, bool):
        raise BadRequest("'chat_template_kwargs.enable_thinking' must be true or false.",
                         param="chat_template_kwargs.enable_thinking")
    for k in kw:
        if k in TEMPLATE_ARGUMENTS:
            hint = " Use the model's own template, with chat_template_kwargs for its " \
                   "variables." if k == "chat_template" else \
                " Send it as the request's own field." if k in (
                    "tools", "documents", "add_generation_prompt",
                    "continue_final_message") else ""
            raise BadRequest(f"'chat_template_kwargs.{k}' is not a template variable.{hint}",
                             param=f"chat_template_kwargs.{k}")
        if not k.isidentifier() or len(k) > 64:
            raise BadRequest(f"'chat_template_kwargs': {k[:64]!r} is not a name a template "
                             "can read.", param="chat_template_kwargs")
    if len(kw) > 64:
        raise BadRequest("'chat_template_kwargs' has more than 64 keys.",
                         param="chat_template_kwargs")
    return think, kw


def hints_of(body: BaseModel, treatment: dict[str, str]) -> list[str]:
    """The hint fields (TREATMENT "hint") the client sent."""
    out = [k for k, v in treatment.items() if v == "hint" and k in body.model_fields_set
           and getattr(body, k, None) is not None]
    for name in body.model_fields_set:  # and a nested object's (stream_options, ...)
        v = getattr(body, name, None)
        if isinstance(v, BaseModel) and hasattr(v, "TREATMENT"):
            out += [f"{name}.{k}" for k in hints_of(v, v.TREATMENT)]
    return out
