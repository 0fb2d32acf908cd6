"""Which model a coding agent can work on: how many tokens the agent's own prompt takes
(measured per pinned release), where the agent compacts in a given window (read from its own
code), and the choice among a node's models (the loaded one first), or the one to download.

A model holds an agent when the point where the agent compacts, with the settings `shoal
connect` writes for that window, is above the agent's prompt (with a margin) and room for a
few turns of work; below that the agent compacts on every turn, or never starts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from engine.errors import ShoalError


@dataclass(frozen=True)
class Prompt:
    tokens: int  # the agent's first request: system prompt, tools and the user's turn
    version: str  # of the agent that sent it


# Each agent's first request, as its release pinned in .agents/package.json sent it (recorded
# in tests/fixtures/agents/AGENT-VERSION.json by tests/engine/api/test_agents_e2e.py: a
# fresh home, an empty project), counted by a node with SmolLM2-135M-Instruct's tokenizer and
# chat template. tests/engine/test_connect_fit.py counts them again, so a new recording
# that changes them fails until they are measured anew. OpenCode's first request names the
# session; its second is the agent's own.
PROMPTS = {"claude": Prompt(12560, "2.1.332"), "codex": Prompt(9104, "0.171.0"),
           "opencode": Prompt(7592, "1.18.33"), "continue": Prompt(1415, "1.5.47")}
NAMES = {"claude": "Claude Code", "codex": "Codex", "opencode": "OpenCode",
         "continue": "Continue"}
MARGIN = 1.2  # another model's tokenizer, the project's own instructions (CLAUDE.md, ...)
WORK = 3072  # a few tool calls and their output before the first compaction
COMPACT_AT = 0.85  # of the window, where Codex is told to compact
CLAUDE_MIN_WINDOW = 100_000  # Claude Code reads a smaller auto-compact window as this


def max_output(window: int) -> int:
    """The answer length each agent is told (Claude Code's, Continue's and OpenCode's own
    defaults, 32,000 or 35% of the window, leave a small window no room to work)."""
    return min(32000, max(1024, window // 8))


def compacts_at(agent: str, window: int) -> int:
    """The prompt size at which `agent` compacts, with the settings written for `window`,
    as its pinned release computes it."""
    out = max_output(window)
    if agent == "claude":  # the window less min(max output, 20,000) less a 13,000 buffer
        return window - min(out, 20000) - 13000
    if agent == "codex":  # model_auto_compact_token_limit, which it caps at 90%
        return min(int(window * COMPACT_AT), window * 9 // 10)
    if agent == "opencode":  # limit.context less min(limit.output, 32,000)
        return window - min(out, 32000)
    # Continue: contextLength less maxTokens less min(max(maxTokens, 20% of the rest), 15,000)
    return window - out - min(max(out, math.ceil(0.2 * (window - out))), 15000)


def needed(agent: str) -> int:
    """The tokens `agent` must be able to hold before it compacts."""
    return math.ceil(PROMPTS[agent].tokens * MARGIN) + WORK


def holds(agent: str, window: int | None) -> bool:
    return bool(window) and compacts_at(agent, window or 0) >= needed(agent)


def least_window(agent: str) -> int:
    """The smallest context window that holds `agent`."""
    low, high = 1, 1 << 24
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if holds(agent, mid) else (mid + 1, high)
    return low


@dataclass(frozen=True)
class Model:
    """A model a node has (on its disk, loaded, or served by an instance) or offers to
    download (from its catalog)."""
    id: str
    context: int | None
    loaded: bool = False
    size_bytes: int | None = None
    fits_memory: bool | None = None  # a catalog entry's, for the node's memory


class NoRoom(ShoalError):
    """No model the agent can work on: the message names what to load or download."""
    status = 400
    type = "invalid_request_error"


def choose(agent: str, models: Sequence[Model], asked: str | None = None,
           catalog: Sequence[Model] = ()) -> Model:
    """The model `agent` should use: `asked` if it holds the agent, else the loaded model
    that does, else the smallest model on disk that does. NoRoom says what to do instead."""
    fitting = [m for m in models if holds(agent, m.context)]
    if asked is not None:
        found = next((m for m in models if m.id == asked), None)
        if found is not None and holds(agent, found.context):
            return found
        others = [m for m in fitting if m.id != asked]
        raise NoRoom(_too_small(agent, [found] if found else [], others, catalog, asked))
    fitting.sort(key=lambda m: (not m.loaded, m.size_bytes or 0, m.id))
    if fitting:
        return fitting[0]
    loaded = [m for m in models if m.loaded]
    raise NoRoom(_too_small(agent, loaded, [], catalog, None))


def to_download(agent: str, catalog: Sequence[Model]) -> Model | None:
    """The smallest catalog model that holds `agent` and fits the node's memory (or whose
    fit isn't known)."""
    ok = [m for m in catalog if holds(agent, m.context) and m.fits_memory is not False
          and m.size_bytes]
    return min(ok, key=lambda m: (m.size_bytes or 0, m.id), default=None)


def about(agent: str, window: int) -> str:
    """One line for the printed settings: the window, the prompt, where it compacts."""
    p = PROMPTS[agent]
    line = (f"{window:,}-token window; {NAMES[agent]} {p.version}'s own prompt is about "
            f"{p.tokens:,} tokens (more in a project with instructions); it compacts at about "
            f"{max(0, compacts_at(agent, window)):,}")
    if not holds(agent, window):
        line += (f". This window is too small for it: it needs at least "
                 f"{least_window(agent):,} (`shoal connect {agent}` names one)")
    elif agent == "claude" and window < CLAUDE_MIN_WINDOW:
        line += (". Claude Code takes no auto-compact window under 100k (it reads "
                 "CLAUDE_CODE_AUTO_COMPACT_WINDOW as 100k), so it is left out: "
                 "CLAUDE_CODE_MAX_CONTEXT_TOKENS sets the window it compacts in")
    return line


def _too_small(agent: str, shown: Sequence[Model], others: Sequence[Model],
               catalog: Sequence[Model], asked: str | None) -> str:
    name, p, least = NAMES[agent], PROMPTS[agent], least_window(agent)
    why = (f"{name}'s own prompt is about {p.tokens:,} tokens ({p.version}), so it needs a "
           f"model with a context window of at least {least:,} tokens (room for its prompt, "
           "a few turns of work, and its compaction)")
    have = " ".join(f"The {'loaded ' if m.loaded and not asked else ''}model {m.id} "
                    + (f"has {m.context:,}." if m.context else "doesn't say its window.")
                    for m in shown)
    out = f"{why}. {have}" if have else f"{why}."
    if others:
        names = ", ".join(f"{m.id} ({m.context:,})" for m in others)
        return f"{out} Models on this node that hold it: {names} (--model NAME)."
    pick = to_download(agent, catalog)
    if pick is None:
        return (f"{out} No model on this node holds it, and none in Shoal's catalog that "
                "fits this machine: find one with `shoal models search`.")
    n = pick.size_bytes or 0
    size = f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"
    return (f"{out} No model on this node holds it. Download one that does, e.g. {pick.id} "
            f"({size}, a {pick.context:,}-token window): `shoal models pull {pick.id}`, then "
            f"run `shoal connect {agent}` again.")
