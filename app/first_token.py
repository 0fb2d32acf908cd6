"""The placement view's predicted wait for the first token, in words: per prompt length
alone, and whether another machine prefilling the prompt (engine/node/handover.py) would
make it sooner, from the planner's "split_prefill" rows (engine/placement/split_prefill.py).
Qt-free."""

from __future__ import annotations

from typing import Any

from app.common import fmt_bytes


def ttft_text(rows: list[dict[str, Any]]) -> str:
    """The predicted wait for the first token, per prompt length, alone on the cluster."""
    if not rows:
        return ""
    parts = [f"{fmt_wait(r['seconds'])} at {fmt_prompt(r['prompt_tokens'])}" for r in rows]
    cached = rows[-1].get("cached_tokens", 0) / rows[-1]["prompt_tokens"]
    return ("Predicted first token: " + " · ".join(parts) + " tokens"
            + (f" ({cached:.0%} of each prompt cached)" if cached else ""))


def split_text(placement: dict[str, Any]) -> str:
    """For the longest prompt the planner split: the placement's prefill node (or the
    other machine that would prefill soonest) against prefilling on the placement itself;
    "" where no other machine could (a group, no other machine holding the model, prompts
    too short to hand over)."""
    rows = placement.get("split_prefill") or []
    if not rows:
        return ""
    longest = max(r["prompt"] for r in rows)
    at = [r for r in rows if r["prompt"] == longest]
    row = next((r for r in at if r["node_id"] == placement.get("prefill")), None) \
        or min(at, key=lambda r: r["split_s"])
    prompt = f"{fmt_prompt(longest)}-token prompt"
    kv = (f"its KV cache, {fmt_bytes(row['kv_bytes'])}, takes {_short(row['transfer_s'])} "
          f"over the link")
    if row["pays"]:
        return (f"Prefill on {row['node']}: first token in {_short(row['split_s'])} "
                f"instead of {_short(row['alone_s'])} for a {prompt} ({kv}).")
    return (f"A prefill node wouldn't pay here: with {row['node']} prefilling, a {prompt} "
            f"would get its first token in {_short(row['split_s'])} instead of "
            f"{_short(row['alone_s'])} ({kv}).")


def fmt_prompt(n: int) -> str:
    return f"{n // 1000}K" if n >= 1000 and n % 1000 == 0 else f"{n:,}"


def fmt_wait(s: float) -> str:
    if s < 10:
        return f"{s:.1f} s"
    if s < 120:
        return f"{s:.0f} s"
    return f"{s / 60:.0f} min"


def _short(s: float) -> str:
    """Seconds, in milliseconds where under a tenth of a second (a small model's)."""
    return f"{s * 1000:.0f} ms" if s < 0.1 else fmt_wait(s)
