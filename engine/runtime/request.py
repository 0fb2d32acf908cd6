"""One generation request in the worker: the prompt (chat template with tools, or raw), the
sampling, and the record stream turned into typed events (content, reasoning, tool calls).

This runs on rank 0 of a group exactly as in one process: `gen` is either generator.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from engine.errors import BadRequest, ContextTooLong
from engine.protocol import (
    Accepted,
    Constraint,
    Delta,
    Done,
    GenerateRequest,
    Message,
    Progress,
    TemplateMessage,
    ToolCall,
    ToolSpec,
)
from engine.records import TokenLogprob
from engine.runtime.harmony import HarmonySplitter, is_harmony
from engine.runtime.pieces import pieces as token_pieces
from engine.runtime.prompt_logprobs import compute, entry, refuse_split
from engine.runtime.sampling import Sampling
from engine.runtime.template import plain, render, template_kwargs
from engine.runtime.toolcalls import (
    GENERIC_END,
    GENERIC_PROMPT,
    GENERIC_START,
    OutputSplitter,
    generic_parse,
)


def _tool_schema(tools: list[ToolSpec], choice: str | dict[str, str]) -> dict[str, Any]:
    """JSON schema of one call in the generic form, for tool_choice required or named."""
    def one(t: ToolSpec) -> dict[str, Any]:
        f = t["function"]
        return {"type": "object", "required": ["name", "arguments"],
                "additionalProperties": False,
                "properties": {"name": {"const": f["name"]},
                               "arguments": f.get("parameters") or {"type": "object"}}}
    if isinstance(choice, dict):
        return one(next(t for t in tools if t["function"]["name"] == choice["name"]))
    return {"anyOf": [one(t) for t in tools]}


def _messages(req: GenerateRequest, generic: bool) -> list[TemplateMessage]:
    msgs = list(req.messages or [])
    if generic and req.tools:
        text = GENERIC_PROMPT.format(tools="\n".join(json.dumps(t["function"])
                                                     for t in req.tools))
        if msgs and msgs[0].get("role") == "system":
            msgs[0] = {**msgs[0], "content": f"{msgs[0].get('content') or ''}\n\n{text}"}
        else:
            msgs.insert(0, {"role": "system", "content": text})
        # Earlier calls and results, in the same generic form.
        msgs = [_generic_history(m) for m in msgs]
    return msgs


def _generic_history(m: TemplateMessage) -> TemplateMessage:
    if m.get("role") == "assistant" and m.get("tool_calls"):
        calls = "".join(f"{GENERIC_START}{json.dumps(c['function'])}{GENERIC_END}"
                        for c in m["tool_calls"])
        return {"role": "assistant", "content": (m.get("content") or "") + calls}
    if m.get("role") == "tool":
        return {"role": "user", "content": f"Tool result: {m.get('content') or ''}"}
    return m


def too_long(tokens: str, ctx_len: int) -> ContextTooLong:
    """In the words clients look for: Claude Code compacts on "prompt is too long", OpenAI
    clients read "maximum context length" (and the code context_length_exceeded)."""
    return ContextTooLong(f"prompt is too long: {tokens} tokens > {ctx_len} maximum (this "
                          f"model's maximum context length is {ctx_len} tokens). Shorten the "
                          "conversation or start a new one.", param="messages")


PEEK_CHARS_PER_TOKEN = 4  # the first look at a long prompt: 4 characters a context token


def _settled_tokens(tokenizer: Any, head: str) -> int | None:
    """How many tokens the text starting with `head` certainly has, from `head` alone, or
    None for a tokenizer this can't tell for (not a Hugging Face fast tokenizer).

    Such a tokenizer encodes every pre-token (a word, a number, a special token) on its own,
    and its normalizer and pre-tokenizer look at most a character or two ahead; so the
    pre-tokens of `head` are those of the whole text except near its cut. The last two are
    dropped, and any that reach into its last 256 characters, to be sure."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    if not isinstance(backend, Tokenizer) or backend.truncation or backend.padding:
        return None
    enc = backend.encode(head, add_special_tokens=False)
    words: list[int] = [w for w in enc.word_ids if w is not None]
    if not words or len(words) < len(enc.word_ids):
        return None
    last = words[-1] - 1  # pre-tokens from this one on may continue past the cut
    for w, (_, end) in zip(words, enc.offsets):
        if end > len(head) - 256:
            last = min(last, w)
            break
    return sum(1 for w in words if w < last)


def _encode(tokenizer: Any, text: str, ctx_len: int | None, **kw: Any) -> list[int]:
    """tokenizer.encode(text), but a text whose beginning alone certainly holds more tokens
    than the context is refused without tokenizing the rest (3.9 MB of chat took 11 s)."""
    head = (ctx_len or 0) * PEEK_CHARS_PER_TOKEN
    while ctx_len and head < len(text):
        settled = _settled_tokens(tokenizer, text[:head])
        if settled is None:
            break
        if settled >= ctx_len:
            raise too_long(f"more than {settled}", ctx_len)
        head *= 2  # costs at most as much again as tokenizing it whole
    return list(tokenizer.encode(text, **kw))


Prepared = tuple[list[int], str, OutputSplitter | HarmonySplitter, Constraint | None, Any]


def prepare(tokenizer: Any, req: GenerateRequest, ctx_len: int | None = None,
            vision: Any = None) -> Prepared:
    """(prompt tokens, prompt text, splitter, constraint, images) for a request. Given the
    context length, a prompt that certainly exceeds it is refused before it is tokenized
    whole. A request with images needs `vision` (engine.runtime.vision.tower.Vision): the
    turns' parts go to the template as content lists, each image expanded to its tokens
    (images: the vision.images.ImagePrompt, else None)."""
    tools = req.tools if req.tools and req.tool_choice != "none" else None
    harmony = hasattr(tokenizer, "get_vocab") and is_harmony(tokenizer)
    native = bool(tools) and (harmony or bool(getattr(tokenizer, "has_tool_calling", False)))
    forced = tools is not None and req.tool_choice != "auto"
    constraint: Constraint | None = None
    if req.messages is None and req.images:  # nothing says where they go
        raise BadRequest("Images go in chat messages; a raw prompt can't take them.",
                         param="images")
    if req.messages is None:  # a raw prompt: no template, no markers
        # (a token prompt's ids were checked before: the tokenizer decodes only u32)
        special = {} if req.add_special is None else {"add_special_tokens": req.add_special}
        prompt = req.prompt if isinstance(req.prompt, list) else \
            _encode(tokenizer, req.prompt or "", ctx_len, **special)
        text = req.prompt if isinstance(req.prompt, str) else tokenizer.decode(prompt)
        if req.suffix is not None:
            prompt = _fill_in_the_middle(tokenizer, prompt, req.suffix)
        return prompt, text, OutputSplitter(), None, None
    msgs = _messages(req, generic=bool(tools) and not native)
    images = None
    kwargs: dict[str, Any] = {**template_kwargs(req), **({"tools": tools} if native else {})}
    if req.images:
        from engine.runtime.vision.images import content_lists
        from engine.runtime.vision.tower import image_order

        if vision is None or not getattr(tokenizer, "has_chat_template", False):
            raise BadRequest("This model doesn't take images; send them to a vision model "
                             "(its capabilities list 'vision').", param="messages")
        turns, _ = content_lists(msgs, len(req.images))
        text = render(tokenizer, turns, req, kwargs)  # type: ignore[arg-type]
        images = vision.prompt(text, image_order(req), bool(req.add_special))
        prompt = images.ids
    elif getattr(tokenizer, "has_chat_template", False):
        text = render(tokenizer, msgs, req, kwargs)
        prompt = _encode(tokenizer, text, ctx_len, add_special_tokens=bool(req.add_special))
    else:
        if req.documents:
            raise BadRequest("'documents': this model has no chat template to take them; "
                             "put their text in a message instead.", param="documents")
        text = plain(msgs, req)
        special = {} if req.add_special is None else {"add_special_tokens": req.add_special}
        prompt = _encode(tokenizer, text, ctx_len, **special)
    think = None
    if getattr(tokenizer, "has_thinking", False) and not forced:
        think = (tokenizer.think_start, tokenizer.think_end)
    reasoning_first = think is not None and text.rfind(think[0]) > text.rfind(think[1])
    markers = None
    if forced:  # the whole answer is one call in the generic form, enforced by a grammar
        assert tools is not None
        constraint = {"json_schema": _tool_schema(tools, req.tool_choice)}
        markers = ("", "", generic_parse)
    elif tools and native:
        markers = (tokenizer.tool_call_start, tokenizer.tool_call_end, tokenizer.tool_parser)
    elif tools:
        markers = (GENERIC_START, GENERIC_END, generic_parse)
    splitter: OutputSplitter | HarmonySplitter = OutputSplitter(
        think=think, tools=markers, tool_specs=tools, reasoning_first=reasoning_first,
        tool_first=forced)
    if harmony and not forced:  # gpt-oss: channels, not markers mlx-lm knows
        splitter = HarmonySplitter()
    return prompt, text, splitter, constraint, images


FIM_TOKENS = [("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder
              ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, SmolLM
              ("<PRE>", "<SUF>", "<MID>")]  # Code Llama


def _fill_in_the_middle(tokenizer: Any, prefix: list[int], suffix: str) -> list[int]:
    """Prefix-suffix-middle order with the model's own FIM tokens, or a 400 if it has none."""
    vocab = tokenizer.get_vocab()
    for pre, suf, mid in FIM_TOKENS:
        if pre in vocab and suf in vocab and mid in vocab:
            return [vocab[pre], *prefix, vocab[suf],
                    *tokenizer.encode(suffix, add_special_tokens=False), vocab[mid]]
    raise BadRequest("'suffix': this model has no fill-in-the-middle tokens; send the prompt "
                     "alone.", param="suffix")


LIST_MAX_TOKENS = 131_072  # a listing's ids and pieces must fit one pipe line (16 MiB)


def _listed(tokenizer: Any, req: GenerateRequest, vision: Any = None) -> Prepared:
    """_prompt() for /tokenize and the like: any length up to LIST_MAX_TOKENS."""
    try:
        found = _prompt(tokenizer, req, LIST_MAX_TOKENS, vision)
    except ContextTooLong:
        found = None
    if found is None or len(found[0]) > LIST_MAX_TOKENS:
        raise BadRequest(f"Shoal lists at most {LIST_MAX_TOKENS} tokens at once; send the "
                         "text in parts.", param="prompt")
    return found


def _prompt(tokenizer: Any, req: GenerateRequest, ctx_len: int | None,
            vision: Any = None) -> Prepared:
    """prepare(), then the prompt's last truncate_prompt_tokens tokens where it asks for
    fewer (the prompt's text then is theirs)."""
    k = req.sampling.truncate_prompt_tokens
    if k is None:
        return prepare(tokenizer, req, ctx_len, vision)
    if req.suffix is not None:  # cutting it would cut the fill-in-the-middle markers
        raise BadRequest("'truncate_prompt_tokens' can't be combined with 'suffix'.",
                         param="truncate_prompt_tokens")
    if req.images:  # cutting it could cut an image's tokens in two
        raise BadRequest("'truncate_prompt_tokens' can't be combined with images.",
                         param="truncate_prompt_tokens")
    prompt, text, splitter, constraint, _ = prepare(tokenizer, req, None)  # may pass ctx
    if len(prompt) > k:
        prompt = prompt[-k:]
        text = str(tokenizer.decode(prompt))
    return prompt, text, splitter, constraint, None


PROGRESS_EVERY_S = 0.5  # prefill progress reaches the node at most this often


def _progress_emitter(rid: str, emit: Callable[[Message], None]
                      ) -> Callable[[int, int, int], None]:
    """Progress events for one request: the first (its admission: the cache hit), then
    at most one a PROGRESS_EVERY_S, and the last chunk's."""
    last = [0.0]

    def progress(cached: int, done: int, total: int) -> None:
        now = time.monotonic()
        if last[0] and now - last[0] < PROGRESS_EVERY_S and done < total - 1:
            return
        last[0] = now
        emit(Progress(rid, cached, done, total))
    return progress


def run(rid: str, req: GenerateRequest, model: Any, tokenizer: Any, ctx_len: int,
        gen: Callable[..., Iterator[Any]], cancel: threading.Event,
        emit: Callable[[Message], None], limit: int | None = None,
        vision: Any = None) -> None:
    """Serve one request, emitting Accepted, Delta/ToolCall…, Done (or raising ShoalError).
    `limit`: one past the largest token id the model takes (engine/runtime/bounds.py);
    every id the request carries is checked against it before anything indexes with it.
    `vision` (engine.runtime.vision.tower.Vision) takes the request's images, if any:
    `gen` then gets them as `images` (their tokens count in the prompt and the context)."""
    from engine.runtime.bounds import check_prompt, check_request, token_limit

    s = req.sampling
    limit = token_limit(model, tokenizer) if limit is None else limit
    ctx_len = min(ctx_len, s.context_limit or ctx_len)  # Ollama's num_ctx
    check_request(req, limit, ctx_len)
    if s.prompt_logprobs is not None:
        refuse_split(model)
        if req.images:
            raise BadRequest("'prompt_logprobs' can't be combined with images yet.",
                             param="prompt_logprobs")
    # /tokenize and the like list a prompt's tokens whatever its length, as vLLM's do
    listing = req.count_only and req.show_prompt
    prompt, text, splitter, constraint, images = _listed(tokenizer, req, vision) \
        if listing else _prompt(tokenizer, req, ctx_len, vision)
    check_prompt(prompt, limit, req)
    if not listing and (len(prompt) > ctx_len or (len(prompt) == ctx_len
                                                   and s.max_tokens != 0)):
        raise too_long(str(len(prompt)), ctx_len)
    shown = text if req.messages is None or req.show_prompt else None
    held = getattr(gen, "prefix", None)
    emit(Accepted(rid, len(prompt), shown, list(prompt) if req.show_prompt else None,
                  token_pieces(tokenizer, prompt) if req.show_prompt else None,
                  held.peek(prompt) if listing and held is not None else None))
    if req.count_only:
        emit(Done(rid, "stop", len(prompt), 0))
        return
    if s.constraint and constraint:
        raise BadRequest("A forced tool call and a response_format can't be combined.",
                         param=s.constraint.get("param") or "response_format")
    grammar = s.constraint or constraint
    if grammar is not None:  # a bad schema is the client's 400, before any rank runs
        from engine.runtime.grammar import check_constraint
        check_constraint(grammar, tokenizer, "tools" if constraint else "response_format")
    scored = None
    if s.prompt_logprobs is not None:
        scored = compute(model, tokenizer, prompt, s.prompt_logprobs, cancel)
    if cancel.is_set() or s.max_tokens == 0:  # max_tokens 0: the prompt's logprobs alone
        emit(Done(rid, "cancelled" if cancel.is_set() else "length", len(prompt), 0,
                  prompt_logprobs=scored))
        return
    sampling = Sampling.of(s, min(s.max_tokens or ctx_len, ctx_len - len(prompt)), grammar)
    lps: list[TokenLogprob] = []
    records = gen(model, tokenizer, prompt, sampling, cancel,
                  progress=_progress_emitter(rid, emit),
                  **({"images": images} if images is not None else {}))
    try:
        for r in records:
            if r.logprob is not None and r.token is not None:
                lps.append(entry(tokenizer, r.token, r.logprob, r.top_logprobs))
            pieces = splitter.feed(r.text)
            if r.finish_reason is not None:
                pieces += splitter.finish()
            finish = r.finish_reason
            for kind, value in pieces:
                if kind == "tool":
                    emit(ToolCall(rid, value.id, value.name, value.arguments))
                    if not req.parallel_tool_calls:  # one call asked for: end with it
                        finish = finish or "stop"
                        break
                else:
                    emit(Delta(rid, value, kind, lps or None, r.generation_tokens))
                    lps = []
            if finish is not None:
                if splitter.made_calls and finish == "stop":
                    finish = "tool_calls"
                emit(Done(rid, finish, r.prompt_tokens, r.generation_tokens, r.prompt_tps,
                          r.generation_tps, r.peak_memory_gb, lps or None,
                          getattr(r, "stop_sequence", None),
                          getattr(r, "cached_tokens", 0),
                          getattr(r, "drafted_tokens", 0), getattr(r, "accepted_tokens", 0),
                          prompt_logprobs=scored))
                return
    finally:
        close = getattr(records, "close", None)
        if close is not None:  # a generation ended early still ends cleanly on every rank
            close()
