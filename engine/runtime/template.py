"""A conversation rendered through the model's chat template, as vLLM renders it: with or
without the assistant header (add_generation_prompt), the last message continued
(continue_final_message), documents for templates that take them, and the client's
chat_template_kwargs.
"""

from __future__ import annotations

import keyword
from typing import Any

from engine.errors import BadRequest
from engine.protocol import GenerateRequest, TemplateMessage

# apply_chat_template's own parameters and what the template is rendered with: a kwarg of
# the same name would replace what this module sets (tokenize=True returns ids, not text)
RESERVED = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template",
    "add_generation_prompt", "continue_final_message", "tokenize", "padding", "truncation",
    "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
    "tokenizer_kwargs", "sanitize_control_tokens", "kwargs"})
MAX_KWARGS = 64
MAX_NAME = 64


def template_kwargs(req: GenerateRequest) -> dict[str, Any]:
    """The extra variables the template gets: the client's chat_template_kwargs (checked),
    with enable_thinking taken from `thinking` (mlx-lm renames it for each model)."""
    asked = dict(req.template_kwargs or {})
    if len(asked) > MAX_KWARGS:
        raise BadRequest(f"'chat_template_kwargs' has {len(asked)} keys; at most "
                         f"{MAX_KWARGS} are taken.", param="chat_template_kwargs")
    for name in asked:
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) \
                or len(name) > MAX_NAME:
            raise BadRequest(f"'chat_template_kwargs' key {str(name)[:MAX_NAME]!r} is not a "
                             "template variable's name (letters, digits and _).",
                             param="chat_template_kwargs")
        if name in RESERVED:
            raise BadRequest(f"'chat_template_kwargs' can't set {name!r}: the request's own "
                             "field for it decides.", param="chat_template_kwargs")
    think = asked.pop("enable_thinking", None)
    if think is not None and not isinstance(think, bool):
        raise BadRequest("'chat_template_kwargs' enable_thinking must be true or false.",
                         param="chat_template_kwargs")
    thinking = req.thinking if req.thinking is not None else think
    if thinking is not None:
        asked["enable_thinking"] = thinking
    return asked


def render(tokenizer: Any, msgs: list[TemplateMessage], req: GenerateRequest,
           kwargs: dict[str, Any]) -> str:
    """The chat template's text for these turns as the request asks them ended, with its
    documents (a 400 naming 'documents' where the template ignores them)."""
    ends = {"add_generation_prompt": False, "continue_final_message": True} \
        if req.continue_final else {"add_generation_prompt": req.add_generation_prompt}
    text, used = _render(tokenizer, msgs, {**ends, **kwargs})
    if not req.documents:
        return text
    try:
        with_docs = str(tokenizer.apply_chat_template(used, tokenize=False,
                                                      documents=req.documents, **ends,
                                                      **kwargs))
    except Exception as e:  # a template (or a custom renderer) that can't take them
        raise BadRequest(f"'documents': the model's chat template refused them: {e}",
                         param="documents") from None
    if with_docs == text:
        raise BadRequest("'documents': this model's chat template doesn't take documents; "
                         "put their text in a message instead.", param="documents")
    return with_docs


def plain(msgs: list[TemplateMessage], req: GenerateRequest) -> str:
    """No template: "role: content" lines, the least surprising fallback, ended as asked."""
    lines = [f"{m['role']}: {m.get('content') or ''}" for m in msgs]
    if req.continue_final:  # the last line stays open
        return "\n".join(lines)
    return "".join(f"{line}\n" for line in lines) + \
        ("assistant: " if req.add_generation_prompt else "")


def _render(tokenizer: Any, msgs: list[TemplateMessage], kwargs: dict[str, Any]
            ) -> tuple[str, list[TemplateMessage]]:
    """(the chat template's text, the turns it rendered). Many templates refuse a system
    turn past the first or two turns of one role in a row (agents send both): those get
    the conversation folded as the Anthropic API folds it, system turns into the next
    user turn, same-role turns joined."""
    try:
        return str(tokenizer.apply_chat_template(msgs, tokenize=False, **kwargs)), msgs
    except Exception as first:  # templates raise on conversations they don't allow
        folded = fold_turns(msgs)
        if folded == msgs:
            raise BadRequest(f"The model's chat template refused this conversation: {first}",
                             param="messages") from None
        try:
            return str(tokenizer.apply_chat_template(folded, tokenize=False,
                                                     **kwargs)), folded
        except Exception as e:
            raise BadRequest(f"The model's chat template refused this conversation: {e}",
                             param="messages") from None


def fold_turns(msgs: list[TemplateMessage]) -> list[TemplateMessage]:
    """System turns after the first become text of the next user turn; consecutive user
    (or assistant) turns without tool calls become one."""
    out: list[TemplateMessage] = []
    carry = ""
    for i, m in enumerate(msgs):
        if m["role"] == "system" and i > 0:
            carry += f"{m.get('content') or ''}\n\n"
            continue
        m = m.copy()
        if carry and m["role"] == "user":
            m["content"], carry = _join(carry, m.get("content"), ""), ""
        prev = out[-1] if out else None
        if prev and prev["role"] == m["role"] and m["role"] in ("user", "assistant") \
                and not prev.get("tool_calls") and not m.get("tool_calls"):
            prev["content"] = _join(prev.get("content"), m.get("content"))
            continue
        out.append(m)
    if carry:
        out.append({"role": "user", "content": carry.strip()})
    return out


def _join(a: Any, b: Any, sep: str = "\n\n") -> Any:
    """Two turns' contents as one: text, or (a vision model's turn) a list of parts."""
    if isinstance(a, list) or isinstance(b, list):
        def parts(c: Any) -> list[Any]:
            return list(c) if isinstance(c, list) else \
                ([{"type": "text", "text": str(c)}] if c else [])
        out: list[Any] = []
        for part in [*parts(a), *([{"type": "text", "text": sep}] if sep and a and b else []),
                     *parts(b)]:  # neighbouring texts as one (templates trim each part)
            if out and part.get("type") == "text" and out[-1].get("type") == "text":
                out[-1] = {**out[-1], "text": out[-1]["text"] + part["text"]}
            else:
                out.append(part)
        return out
    return f"{a or ''}{sep}{b or ''}"
