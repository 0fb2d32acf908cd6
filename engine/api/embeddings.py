"""Embedding routes: OpenAI's POST /v1/embeddings (vLLM's extensions too), Ollama's
/api/embed and its older /api/embeddings. Each is one Embed to the named model's worker,
which runs beside the chat model (engine/node/beside.py) and batches a request's inputs;
the answer is rendered in the route's shape (the openai and ollama SDKs' types)."""

from __future__ import annotations

import base64
import math
import time
from typing import Any, cast

import numpy as np
from aiohttp import web

from engine import protocol as wire
from engine.api import common, hints
from engine.api.backend import backend, placed
from engine.api.embedding_schemas import (
    MAX_CHARS,
    EmbeddingsRequest,
    OllamaCommon,
    OllamaEmbed,
    OllamaEmbeddings,
)
from engine.api.render import error_of
from engine.errors import BadRequest, WorkerFailed

routes = web.RouteTableDef()
DTYPES = {"float32": "f4", "float16": "f2"}
ORDER = {"native": "<" if np.little_endian else ">", "little": "<", "big": ">"}


async def embed(request: web.Request, model: str, cmd: wire.Embed) -> wire.Embedded:
    """The worker's vectors for `cmd`, one per input, each `cmd.dimensions` long if given;
    its refusal as the error of its kind."""
    ans = await backend(request).embed(model, cmd)
    if isinstance(ans, wire.Error):
        raise error_of(ans)
    if not isinstance(ans, wire.Embedded) or len(ans.vectors) != len(cmd.inputs):
        raise WorkerFailed(f"The worker for {model} answered {len(cmd.inputs)} inputs with "
                           f"{len(getattr(ans, 'vectors', []))} vectors.")
    if cmd.dimensions is not None:
        return _cut(ans, cmd.dimensions, cmd.normalize)
    return ans


def _cut(ans: wire.Embedded, dimensions: int, normalize: bool) -> wire.Embedded:
    """Each vector's first `dimensions` (renormalized), where the worker left them whole;
    more than the model has is a 400 naming `dimensions`."""
    size = min((len(v) for v in ans.vectors), default=dimensions)
    if size < dimensions:
        raise BadRequest(f"'dimensions' is {dimensions}, and this model's vectors have "
                         f"{size}: ask for at most {size}.", param="dimensions")
    if all(len(v) == dimensions for v in ans.vectors):
        return ans
    out = []
    for v in ans.vectors:
        cut = v[:dimensions]
        norm = math.sqrt(sum(x * x for x in cut)) if normalize else 0.0
        out.append([x / norm for x in cut] if norm > 0 else cut)
    return wire.Embedded(ans.id, out, ans.prompt_tokens)


def _encoded(v: list[float], body: EmbeddingsRequest) -> list[float] | str:
    if body.encoding_format == "float":
        return v
    dtype = ORDER[body.endianness] + DTYPES[body.embed_dtype]
    return base64.b64encode(np.asarray(v, dtype=dtype).tobytes()).decode("ascii")


@routes.post("/v1/embeddings")
@placed
async def openai_embeddings(request: web.Request) -> web.Response:
    """Embeddings (OpenAI; vLLM's extensions)."""
    body = common.parse(EmbeddingsRequest, await common.read_json(request))
    body.check()
    hints.note(request, body.hints())
    inputs = cast(list[str | list[int]], body.input)  # the validator made it a list
    cmd = wire.Embed("", inputs, body.dimensions, body.normalized())
    ans = await embed(request, body.model, cmd)
    data = [{"object": "embedding", "index": i, "embedding": _encoded(v, body)}
            for i, v in enumerate(ans.vectors)]
    return web.json_response({
        "object": "list", "data": data, "model": body.model,
        "usage": {"prompt_tokens": ans.prompt_tokens, "total_tokens": ans.prompt_tokens}})


def _ollama(body: OllamaCommon, request: web.Request) -> str:
    """The model's name (Ollama's default tag dropped), after the checks and the hints;
    the request's keep_alive holds from now on."""
    from engine.api.ollama import keep_alive_seconds
    body.check()
    hints.note(request, body.hints())
    model = body.model.removesuffix(":latest")
    if body.keep_alive is not None:
        backend(request).keep_alive(model, keep_alive_seconds(body.keep_alive))
    return model


async def _load_only(request: web.Request, model: str, keep_alive: Any) -> None:
    """An empty input loads the model (with keep_alive 0: unloads it), as Ollama does."""
    from engine.api.ollama import keep_alive_seconds
    if keep_alive is not None and keep_alive_seconds(keep_alive) == 0:
        await backend(request).unload(model)
    else:
        await backend(request).prepare(model, "embed")


@routes.post("/api/embed")
@placed
async def ollama_embed(request: web.Request) -> web.Response:
    """Embeddings (Ollama)."""
    t0 = time.perf_counter_ns()
    body = common.parse(OllamaEmbed, await common.read_json(request))
    model = _ollama(body, request)
    if not body.input:
        await _load_only(request, model, body.keep_alive)
        return web.json_response({"model": model, "embeddings": []})
    cmd = wire.Embed("", list(body.input), body.dimensions, True,
                     body.truncate is not False)
    ans = await embed(request, model, cmd)
    took = time.perf_counter_ns() - t0
    return web.json_response({"model": model, "embeddings": ans.vectors,
                              "total_duration": took, "load_duration": 0,
                              "prompt_eval_count": ans.prompt_tokens})


@routes.post("/api/embeddings")
@placed
async def ollama_embeddings(request: web.Request) -> web.Response:
    """One embedding (Ollama's older route)."""
    body = common.parse(OllamaEmbeddings, await common.read_json(request))
    model = _ollama(body, request)
    if not body.prompt:
        await _load_only(request, model, body.keep_alive)
        return web.json_response({"embedding": []})
    if len(body.prompt) > MAX_CHARS:
        raise BadRequest("'prompt' is too long.", param="prompt")
    # as Ollama's: the model's own vector, not scaled to unit length
    ans = await embed(request, model, wire.Embed("", [body.prompt], normalize=False))
    return web.json_response({"embedding": ans.vectors[0]})

