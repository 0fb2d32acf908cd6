"""`shoal connect AGENT`: the settings each coding agent needs for a node's model, read
from the node itself, printed or written into the agent's own file without a secret."""

from __future__ import annotations

import json
import tomllib

import pytest
import yaml

from engine import connect
from engine.connect import Target


@pytest.fixture
def target() -> Target:
    return Target("http://127.0.0.1:8421", "Qwen3-4B-4bit", 40960)


def test_claude_code_gets_every_tier_the_real_window_and_no_billing_header(target):
    env = connect.claude_env(target)
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8421"  # it appends /v1 itself
    tiers = ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL",
             "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
             "ANTHROPIC_SMALL_FAST_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL")
    assert {env[t] for t in tiers} == {"Qwen3-4B-4bit"}
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "40960"
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "5120"  # its 32,000 leaves no room
    assert env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"


def test_claude_code_gets_an_auto_compact_window_only_where_it_takes_one():
    """Claude Code 2.1.x reads CLAUDE_CODE_AUTO_COMPACT_WINDOW under 100k as 100k (and says
    so on every start); under it, CLAUDE_CODE_MAX_CONTEXT_TOKENS alone sets the window."""
    small = connect.claude_env(Target("http://h:1", "m", 40960))
    assert "CLAUDE_CODE_AUTO_COMPACT_WINDOW" not in small
    big = connect.claude_env(Target("http://h:1", "m", 131072))
    assert big["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == big["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] \
        == "131072"
    shown = connect.render("claude", Target("http://h:1", "m", 40960))
    assert "unset CLAUDE_CODE_AUTO_COMPACT_WINDOW" in shown  # an earlier export goes
    assert "treats" not in shown and "100k" in shown  # the limit, said plainly


def test_a_window_written_earlier_for_a_larger_model_is_removed(tmp_path):
    connect.write("claude", Target("http://h:1", "big", 131072), tmp_path)
    path = connect.write("claude", Target("http://h:1", "small", 40960), tmp_path)
    env = json.loads(path.read_text())["env"]
    assert "CLAUDE_CODE_AUTO_COMPACT_WINDOW" not in env
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "40960"


def test_codex_uses_the_responses_api_with_the_window_and_a_compaction_limit(target):
    cfg = tomllib.loads(connect.codex_toml(target))
    assert cfg["model"] == "Qwen3-4B-4bit" and cfg["model_provider"] == "shoal"
    assert cfg["model_providers"]["shoal"] == {
        "name": "Shoal", "base_url": "http://127.0.0.1:8421/v1", "wire_api": "responses"}
    assert cfg["model_context_window"] == 40960
    assert cfg["model_auto_compact_token_limit"] == int(40960 * connect.COMPACT_AT)


def test_opencode_and_continue_know_the_limits(target):
    oc = connect.opencode_json(target)
    model = oc["provider"]["shoal"]["models"]["Qwen3-4B-4bit"]
    assert model["limit"] == {"context": 40960, "output": 5120}
    assert oc["model"] == "shoal/Qwen3-4B-4bit"
    assert oc["compaction"] == {"auto": True}  # at limit.context less limit.output
    cn = yaml.safe_load(connect.continue_yaml(target))
    assert {m["apiBase"] for m in cn["models"]} == {"http://127.0.0.1:8421/v1"}
    assert all(m["defaultCompletionOptions"] == {"contextLength": 40960, "maxTokens": 5120}
               for m in cn["models"])


@pytest.mark.parametrize("agent", connect.AGENTS)
def test_a_key_is_never_written_to_a_file(tmp_path, agent):
    t = Target("http://10.0.0.2:8421", "m", 32768, needs_key=True)
    path = connect.write(agent, t, tmp_path)
    text = path.read_text()
    assert connect.KEY_ENV in text  # read from the environment at run time
    assert "secret-key" not in text
    if agent == "claude":
        settings = json.loads(text)
        assert settings["apiKeyHelper"] == f"printenv {connect.KEY_ENV}"
        assert "ANTHROPIC_AUTH_TOKEN" not in settings["env"]


def test_writing_keeps_the_users_other_settings(tmp_path, target):
    path = connect.config_path("claude", tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"theme": "dark", "env": {"MY_VAR": "1"}}))
    connect.write("claude", target, tmp_path)
    settings = json.loads(path.read_text())
    assert settings["theme"] == "dark" and settings["env"]["MY_VAR"] == "1"
    codex = connect.config_path("codex", tmp_path)
    codex.parent.mkdir(parents=True)
    codex.write_text('model = "gpt-5"\n')
    connect.write("codex", target, tmp_path)
    [backup] = codex.parent.glob("config.toml.*.bak")  # dated: see test_connect_files.py
    assert backup.read_text() == 'model = "gpt-5"\n'


def test_the_command_reads_the_model_and_window_from_a_running_node(tiny_node, capsys):
    """tiny-llama's 4096-token window holds no agent's own prompt: the command reads it
    from the node, says so with a model to download, and exits 1 (test_connect_fit.py has
    the rest)."""
    from engine.cli import main
    assert main(["connect", "codex", "--url", tiny_node.url]) == 1
    said = capsys.readouterr().err
    assert "tiny-llama has 4,096" in said and "shoal models pull" in said


def test_the_readme_shows_what_the_command_prints():
    """README's agent section is `shoal connect`'s output for SmolLM2 (8192 tokens)."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Pointing agents and chat UIs at Shoal", 1)[1].split("\n## ")[0]
    t = Target("http://127.0.0.1:8421", "mlx-community/Qwen3-4B-4bit", 40960)
    toml_block = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    shown = [line for line in toml_block.splitlines() if not line.startswith("#")]
    assert shown == connect.codex_toml(t).splitlines()
    env = connect.claude_env(t)
    block = re.search(r"which sets.*?```sh\n(.*?)```", section, re.S).group(1)
    named = set()
    for line in block.splitlines():
        if line.startswith("unset "):
            assert line.split()[1] not in env
            continue
        name, value = line.removeprefix("export ").split("#")[0].strip().split("=", 1)
        assert env[name] == value, name
        named.add(name)
    assert {"CLAUDE_CODE_MAX_CONTEXT_TOKENS", "CLAUDE_CODE_MAX_OUTPUT_TOKENS"} <= named


EVIL = "x'\"; $(touch PWNED) `touch PWNED` a: b #c"  # a name a hostile node could give


def test_a_hostile_model_name_stays_a_value_in_every_agents_settings(tmp_path):
    """A node (or a folder on it) can name a model anything: quotes, $( ), a YAML colon.
    The shell's eval, TOML and YAML read it back as the name, and nothing runs."""
    import subprocess
    t = Target("http://127.0.0.1:8421", EVIL, 40960)
    out = subprocess.run(["bash", "-c", 'eval "$1"; printf %s "$ANTHROPIC_MODEL"', "-",
                          connect.render("claude", t)], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout
    assert out == EVIL and not (tmp_path / "PWNED").exists()
    cfg = tomllib.loads(connect.codex_toml(t))
    assert cfg["model"] == EVIL and set(cfg) == {
        "model", "model_provider", "model_context_window", "model_auto_compact_token_limit",
        "model_providers"}
    assert {m["model"] for m in yaml.safe_load(connect.continue_yaml(t))["models"]} == {EVIL}
    for name in ("1.5", "null", "true"):  # names YAML would read as something else
        cn = yaml.safe_load(connect.continue_yaml(Target("http://h:1", name, 40960)))
        assert {m["model"] for m in cn["models"]} == {name}


def test_a_hostile_node_cannot_put_a_line_into_the_settings(tmp_path):
    """A node that names a model with a newline (no real node can have one) or answers
    with something that isn't a list of models: the name is left out, the answer refused
    with a sentence, and nothing crashes."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    answers = {"/v1/models": {"data": [
        {"id": "ok\nexport EVIL=1", "shoal": {"context_length": 131072}},
        {"id": "fine", "shoal": {"context_length": 131072}}]}, "/shoal/status": {}}

    class Hostile(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(answers.get(self.path, {})).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Hostile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        t = connect.target(url, None, None, "claude")
        assert t.model == "fine" and "EVIL" not in connect.render("claude", t)
        answers["/v1/models"] = ["not", "a", "list", "of", "models"]
        from engine.errors import PeerUnreachable
        with pytest.raises(PeerUnreachable, match="isn't a Shoal node's list of models"):
            connect.target(url, None, None, "codex")
    finally:
        server.shutdown()
