"""The utility routes of llama.cpp's server and vLLM's, which tools written for them call:
POST /tokenize, /detokenize, /apply-template and GET /props.

/tokenize takes either dialect, told apart by its body: llama.cpp's `content` or vLLM's
`prompt` / `messages`, and answers in that dialect's shape. /detokenize's two dialects send
the same body, so the answer carries both dialects' keys (llama.cpp's `content`, vLLM's
`prompt`). Each is one count-only request to the model's worker (or the node serving it),
as Anthropic's count_tokens is: the worker's tokenizer and chat template are the truth.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, cast

from aiohttp import web
from pydantic import Field, StrictInt

from engine import __version__
from engine import protocol as wire
from engine.api import common, hints
from engine.api.backend import backend
from engine.api.openai_chat import template_messages
from engine.api.openai_schemas import ChatMessage, NamedChoice, Strict, Tool, choose_tool
from engine.errors import BadRequest, ModelNotFound, ShoalError

routes = web.RouteTableDef()
MAX_IDS = 1_000_000  # more ids than any context holds; the body limit bounds it anyway
TokenId = Annotated[StrictInt, Field(ge=0, le=2**32 - 1)]


class LlamaTokenize(Strict):
    """llama.cpp's /tokenize."""
    model: str | None = Field(default=None, min_length=1)
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class VllmTokenizePrompt(Strict):
    """vLLM's TokenizeCompletionRequest."""
    model: str | None = Field(default=None, min_length=1)
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class ChatTemplateFields(Strict):
    """What renders a conversation through the model's chat template."""
    model: str | None = Field(default=None, min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool | None = None  # None: True, unless continuing
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedChoice | None = None
    documents: list[dict[str, Any]] | None = None


class VllmTokenizeChat(ChatTemplateFields):
    """vLLM's TokenizeChatRequest."""
    add_special_tokens: bool = False
    return_token_strs: bool | None = False
    mm_processor_kwargs: dict[str, Any] | None = None  # images' processing: text here


class Detokenize(Strict):
    """llama.cpp's and vLLM's /detokenize (the same body)."""
    model: str | None = Field(default=None, min_length=1)
    tokens: list[TokenId] = Field(max_length=MAX_IDS)


class ApplyTemplate(ChatTemplateFields):
    """llama.cpp's /apply-template."""


def _chat_request(body: ChatTemplateFields, add_special: bool | None = None
                  ) -> wire.GenerateRequest:
    if body.chat_template is not None:
        raise BadRequest("'chat_template': this node renders with the model's own chat "
                         "template; leave it out.", param="chat_template")
    tools: list[wire.ToolSpec] | None = [
        {"type": "function", "function": cast(wire.ToolFunction, t.function.model_dump(
            exclude_none=True))} for t in body.tools] if body.tools else None
    cont = body.continue_final_message
    if cont and body.add_generation_prompt:
        raise BadRequest("'continue_final_message' and 'add_generation_prompt' can't both be "
                         "true: the first continues the last message, the second starts a "
                         "new one.", param="continue_final_message")
    return wire.GenerateRequest(
        messages=template_messages(body.messages), tools=tools,
        tool_choice=choose_tool(body.tools, body.tool_choice), count_only=True,
        show_prompt=True, continue_final=cont,
        add_generation_prompt=not cont if body.add_generation_prompt is None
        else body.add_generation_prompt,
        template_kwargs=body.chat_template_kwargs, documents=body.documents,
        add_special=add_special)


def _renamed(e: ShoalError, field: str) -> ShoalError:
    """The worker names a prompt 'prompt' or 'messages'; here the client called it
    `field`."""
    if e.param in ("prompt", "messages") and e.param != field:
        e.message = e.message.replace(f"'{e.param}'", f"'{field}'")
        e.param = field
    return e


async def _worker_prompt(request: web.Request, model: str | None,
                         req: wire.GenerateRequest, field: str
                         ) -> tuple[str, wire.Accepted, int | None]:
    """(the model that answered, its Accepted with the prompt's text and ids, the model's
    context length) for a count-only request."""
    try:
        async with common.generation(request, model, req) as g:
            await g.answer()
    except ShoalError as e:
        raise _renamed(e, field) from None
    acc = g.accepted
    if acc.prompt_ids is None or acc.prompt_text is None:
        raise ShoalError("This node's worker didn't report the prompt's tokens (it is older "
                         "than this node); restart the model.")
    return g.model, acc, await _context_of(request, g.model)


async def _context_of(request: web.Request, model: str) -> int | None:
    for m in await backend(request).models():
        if m.id == model:
            return m.context_length
    return None


def _pieces(acc: wire.Accepted, field: str) -> list[str | list[int]]:
    pieces = acc.prompt_pieces
    if pieces is None:
        raise BadRequest(f"'{field}': this node can't show each token's text yet; leave it "
                         "out.", param=field)
    return list(pieces)


async def _read(request: web.Request) -> dict[str, Any]:
    raw = await common.read_json(request)
    if not isinstance(raw, dict):
        raise BadRequest("The request body must be a JSON object.")
    return raw


@routes.post("/tokenize")
async def tokenize(request: web.Request) -> web.StreamResponse:
    """Tokenize a text (llama.cpp: content; vLLM: prompt) or a conversation (vLLM)."""
    raw = await _read(request)
    if "content" in raw:
        body: Any = common.parse(LlamaTokenize, raw)
    elif "messages" in raw:
        body = common.parse(VllmTokenizeChat, raw)
    elif "prompt" in raw:
        body = common.parse(VllmTokenizePrompt, raw)
    else:
        raise BadRequest("Send the text to tokenize as 'content' (llama.cpp) or 'prompt' "
                         "(vLLM), or a conversation as 'messages'.", param="content")
    relayed = await backend(request).relay(request, body.model, raw)
    if relayed is not None:
        return relayed
    if isinstance(body, LlamaTokenize):
        if not body.parse_special:
            raise BadRequest("'parse_special': false isn't supported here: special tokens "
                             "written in the text are always read as special tokens.",
                             param="parse_special")
        req = wire.GenerateRequest(prompt=body.content, count_only=True, show_prompt=True,
                                   add_special=body.add_special)
        _, acc, _ = await _worker_prompt(request, body.model, req, "content")
        ids = list(acc.prompt_ids or [])
        if not body.with_pieces:
            return web.json_response({"tokens": ids})
        return web.json_response({"tokens": [
            {"id": i, "piece": p} for i, p in zip(ids, _pieces(acc, "with_pieces"),
                                                    strict=True)]})
    if isinstance(body, VllmTokenizeChat):
        if body.mm_processor_kwargs is not None:
            hints.note(request, ["mm_processor_kwargs"])
        req = _chat_request(body, body.add_special_tokens)
        field = "messages"
    else:
        req = wire.GenerateRequest(prompt=body.prompt, count_only=True, show_prompt=True,
                                   add_special=body.add_special_tokens)
        field = "prompt"
    _, acc, ctx_len = await _worker_prompt(request, body.model, req, field)
    ids = list(acc.prompt_ids or [])
    out: dict[str, Any] = {"count": len(ids), "max_model_len": ctx_len, "tokens": ids,
                           "token_strs": None}
    if body.return_token_strs:  # strings only: a split character's bytes as decoded
        out["token_strs"] = [p if isinstance(p, str) else bytes(p).decode(errors="replace")
                             for p in _pieces(acc, "return_token_strs")]
    return web.json_response(out)


@routes.post("/detokenize")
async def detokenize(request: web.Request) -> web.StreamResponse:
    """Token ids to text: llama.cpp's answer (content) and vLLM's (prompt) in one."""
    raw = await _read(request)
    body = common.parse(Detokenize, raw)
    relayed = await backend(request).relay(request, body.model, raw)
    if relayed is not None:
        return relayed
    if not body.tokens:
        return web.json_response({"content": "", "prompt": ""})
    req = wire.GenerateRequest(prompt=list(body.tokens), count_only=True, show_prompt=True)
    _, acc, _ = await _worker_prompt(request, body.model, req, "tokens")
    text = acc.prompt_text or ""
    return web.json_response({"content": text, "prompt": text})


@routes.post("/apply-template")
async def apply_template(request: web.Request) -> web.StreamResponse:
    """The conversation through the model's chat template, as text (llama.cpp)."""
    raw = await _read(request)
    body = common.parse(ApplyTemplate, raw)
    relayed = await backend(request).relay(request, body.model, raw)
    if relayed is not None:
        return relayed
    _, acc, _ = await _worker_prompt(request, body.model, _chat_request(body), "messages")
    return web.json_response({"prompt": acc.prompt_text})


def chat_template(path: Path) -> str:
    """The model's chat template as its files give it ("" where it has none)."""
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(errors="replace")
    cfg = path / "tokenizer_config.json"
    try:
        t = json.loads(cfg.read_text()).get("chat_template") if cfg.is_file() else None
    except (OSError, ValueError):
        return ""
    if isinstance(t, list):  # named templates: the default one
        t = next((x.get("template") for x in t if isinstance(x, dict)
                  and x.get("name") == "default"), None)
    return t if isinstance(t, str) else ""


# Shoal's sampling defaults (engine/runtime/sampling.py), in llama.cpp's names
DEFAULT_PARAMS = {"n_predict": -1, "temperature": 0.0, "top_k": 0, "top_p": 1.0,
                  "min_p": 0.0, "typical_p": 1.0, "xtc_probability": 0.0,
                  "xtc_threshold": 0.1, "repeat_penalty": 1.0, "presence_penalty": 0.0,
                  "frequency_penalty": 0.0, "mirostat": 0, "stop": [], "ignore_eos": False,
                  "n_probs": 0, "min_keep": 0, "grammar": "",
                  "samplers": ["top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]}


@routes.get("/props")
async def props(request: web.Request) -> web.Response:
    """The model's properties in llama.cpp's shape (?model= to choose one)."""
    be = backend(request)
    name = request.query.get("model") or be.loaded_model()
    local = await be.models()
    if name is None:
        if len(local) != 1:
            raise BadRequest("No model is loaded: name one with ?model=<id>.", param="model")
        name = local[0].id
    found = next((m for m in local if m.id == name), None)
    if found is None and not any(r.id == name for r in be.remote_models()):
        raise ModelNotFound(f"The model '{name}' is not on this node.", param="model")
    # a model another node serves, without its files here: its name is all this node knows
    ctx = found.context_length if found else None
    template = chat_template(found.path) if found else ""
    return web.json_response({
        "default_generation_settings": {"n_ctx": ctx, "model": name,
                                        "params": DEFAULT_PARAMS},
        "model_alias": name, "model_path": name,  # the id: never a path on this machine
        "chat_template": template, "modalities": {"vision": False, "audio": False},
        "is_loaded": be.loaded_model() == name, "build_info": f"shoal-{__version__}"})
