"""What a streamed answer does to its reply (Qt-free): the text (the same message going on
after Continue), the reasoning, the figures under it (the wait from Send, the speed so far and
at the end, also of a reply the user stopped), and its line in the request log.

Keys starting with "_" in a reply's stats are bookkeeping while it streams; close()
drops them, so only figures are saved."""

from __future__ import annotations

import time
from typing import Any

from app.conversations import Message
from engine.client import ChatDelta

# What a new answer replaces when the reply goes on (Continue).
RESTARTED = ("finish_reason", "generation_tps", "wait_s", "ttft_s", "load_s", "stopped")


def take(reply: Message, d: ChatDelta, started: float) -> str | None:
    """Add one delta to the reply. Returns the line saying what it waits for: a text,
    "" once the first token is there, None when that didn't change."""
    s, wait = reply.stats, None
    if d.prefill is not None and "_first_at" not in s:
        cached, done, total = d.prefill
        wait = (f"Reading your message: {done:,}/{total:,} tokens"
                + (f" ({cached:,} from the cache)" if cached else "") + "…")
    if (d.text or d.reasoning) and "_first_at" not in s:
        now = time.monotonic()
        s["_first_at"] = now
        s["wait_s"] = now - started  # what the user waited, from Send
        if "_loading_since" in s:
            s["load_s"] = max(s.get("_loaded_at", now) - s["_loading_since"], 0.0)
        wait = ""
    if d.text:
        s["_pieces"] = s.get("_pieces", 0) + 1
        s["_last_at"] = time.monotonic()
    if "_before" in s:  # Continue: the model goes on with the same message
        s["_more"] += d.text
        reply.content = s["_before"] + s["_more"]
    else:
        reply.content += d.text
    reply.reasoning += d.reasoning  # kept apart from what is sent back to the model
    for key in ("ttft_s", "generation_tps", "prompt_tps"):
        if key in d.shoal:
            s[key] = d.shoal[key]
    if d.usage:
        tokens = d.usage.get("completion_tokens")
        s["completion_tokens"] = (None if tokens is None
                                  else tokens + int(s.get("_earlier_tokens") or 0))
        s["cached_tokens"] = (d.usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        spec = d.usage.get("speculative") or {}
        s["drafted_tokens"] = spec.get("drafted_tokens")
        s["accepted_tokens"] = spec.get("accepted_tokens")
    if d.finish_reason:
        s["finish_reason"] = d.finish_reason
    return wait


def speed(stats: dict[str, Any], till: float | None = None) -> float | None:
    """Tokens per second since the first token (None until there is enough to say): the
    first piece came at _first_at, so the pieces after it are what was generated."""
    pieces, first = int(stats.get("_pieces") or 0), stats.get("_first_at")
    seconds = (till if till is not None else time.monotonic()) - first if first else 0.0
    return (pieces - 1) / seconds if pieces > 1 and seconds > 0.2 else None


def go_on(reply: Message) -> str:
    """Continue: the model is sent the reply as the start of its answer and goes on with
    it (continue_final_message), so what comes is the rest of the same text, added as it
    is, its tokens counted on. Returns the text sent: trailing spaces and newlines left
    out, as chat templates trim them (the model writes them again where they belong)."""
    done = int(reply.stats.get("completion_tokens") or 0)
    for key in RESTARTED:
        reply.stats.pop(key, None)
    before = reply.content.rstrip()
    reply.stats.update(_earlier_tokens=done, _before=before, _more="")
    return before


def close(reply: Message, stopped: bool) -> dict[str, Any]:
    """The stream ended: keep the figures, drop the bookkeeping, and return the request
    log's line. A stopped reply gets no figures from the node, so its speed and tokens
    are what the app counted."""
    s = reply.stats
    started, wall, unsent = s.get("_started"), s.get("_wall"), bool(s.get("_unsent"))
    if s.get("generation_tps") is None and reply.error is None:
        s["generation_tps"] = speed(s, till=s.get("_last_at"))
        if s.get("completion_tokens") is None and s.get("_pieces"):
            s["completion_tokens"] = int(s.get("_earlier_tokens") or 0) + s["_pieces"]
    for key in [k for k in s if k.startswith("_")]:
        s.pop(key)
    if s.get("generation_tps") is None:
        s.pop("generation_tps", None)
    return request_record(reply, started, wall, stopped, unsent)


def request_record(reply: Message, started: float | None, wall: float | None,
                   stopped: bool, unsent: bool = False) -> dict[str, Any]:
    """One line of the Developer panel's request log."""
    took = time.monotonic() - started if started else None
    s = reply.stats
    if reply.error:
        outcome = reply.error
    elif stopped or s.get("stopped"):
        outcome = "stopped by the user"
    else:
        tokens, why = s.get("completion_tokens", "?"), s.get("finish_reason") or "done"
        outcome = f"{tokens} tokens, {why}"
    return {"at": wall or time.time(), "route": "POST /v1/chat/completions",
            "client": "Shoal chat", "model": s.get("model"), "ok": reply.error is None,
            "outcome": outcome, "seconds": took, "reached": not unsent}
