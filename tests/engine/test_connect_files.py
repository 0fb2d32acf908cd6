"""`shoal connect AGENT --write` on files a user already has: only Shoal's keys change,
the user's own settings and comments stay, a dated backup holds the file as it was (and
is never overwritten), and a file it can't parse is left alone with a message."""

from __future__ import annotations

import json
import re
import stat
import tomllib

import pytest
import yaml

from engine import connect
from engine.cli import main
from engine.connect import Target
from engine.connect_jsonc import loads as jsonc_loads

SMOL = Target("http://127.0.0.1:8421", "SmolLM2-135M-Instruct", 8192)
QWEN = Target("http://10.0.0.2:8421", "Qwen3-8B", 32768, needs_key=True)
BACKUP = re.compile(r"\.\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d(_\d+)?\.bak$")

CODEX = """\
# my codex config
model = "gpt-5"  # the one I use most
approval_policy = "on-request"

[model_providers.proxy]
name = "Proxy"   # the office proxy
base_url = "https://proxy.example/v1"

# for quick questions
[profiles.fast]
model = "gpt-5-mini"
model_provider = "proxy"
"""

CLAUDE = """\
{
    "theme": "dark",
    "permissions": {"allow": ["Bash(ls:*)", "Read"]},
    "env": {
        "MY_VAR": "1",
        "ANTHROPIC_MODEL": "claude-opus"
    },
    "hooks": {}
}
"""

OPENCODE = """\
{
  // my OpenCode setup
  "$schema": "https://opencode.ai/config.json",
  "theme": "tokyonight", /* the dark one */
  "provider": {
    /* my local Ollama */
    "ollama": {
      "npm": "@ai-sdk/openai-compatible",
      "options": {"baseURL": "http://localhost:11434/v1",},
    },
  },
  "autoupdate": false, // I update by hand
}
"""

CONTINUE = """\
# Continue's config
name: My Assistant   # shown in the sidebar
version: 1.0.0
schema: v1
models:
  # the cloud one
  - name: GPT-4o
    provider: openai
    model: gpt-4o
    apiKey: ${{ secrets.OPENAI_API_KEY }}
    roles:
      - chat
  # local Ollama
  - name: Llama
    provider: ollama
    model: "llama3.1:8b"
# code context
context:
  - provider: code
"""


def users_file(home, agent, text, name=None):
    path = connect.config_path(agent, home)
    path = path.with_name(name) if name else path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def backups(path):
    return sorted(p for p in path.parent.iterdir()
                  if p.name.startswith(path.name) and BACKUP.search(p.name))


def kept_lines(original, result, changed=()):
    """The original's lines, but for the ones named, are all in the result, in order."""
    out = iter(result.splitlines())
    return all(any(line == o for o in out) for line in original.splitlines()
               if not line.startswith(changed) or not changed)


def test_codex_keeps_the_users_comments_providers_and_profiles(tmp_path):
    path = users_file(tmp_path, "codex", CODEX)
    written = connect.write_config("codex", SMOL, tmp_path)
    text = path.read_text()
    cfg = tomllib.loads(text)
    assert cfg["model"] == "SmolLM2-135M-Instruct" and cfg["model_provider"] == "shoal"
    assert cfg["model_providers"]["shoal"]["base_url"] == "http://127.0.0.1:8421/v1"
    assert cfg["model_providers"]["proxy"]["base_url"] == "https://proxy.example/v1"
    assert cfg["profiles"]["fast"] == {"model": "gpt-5-mini", "model_provider": "proxy"}
    assert cfg["approval_policy"] == "on-request"
    # every line of the user's is still there but the model's, whose comment stays
    assert kept_lines(CODEX, text, changed=("model =",))
    assert 'model = "SmolLM2-135M-Instruct"  # the one I use most' in text
    assert written.backup is not None and backups(path) == [written.backup]
    assert written.backup.read_text() == CODEX


def test_two_writes_keep_two_backups_and_the_first_stays_the_original(tmp_path):
    path = users_file(tmp_path, "codex", CODEX)
    connect.write("codex", SMOL, tmp_path)
    after_first = path.read_text()
    connect.write("codex", QWEN, tmp_path)  # within the same second: a counter
    kept = backups(path)
    assert len(kept) == 2 and {p.read_text() for p in kept} == {CODEX, after_first}
    assert kept[0].read_text() == CODEX  # and it lists first
    assert tomllib.loads(path.read_text())["model_providers"]["shoal"]["env_key"] == \
        connect.KEY_ENV
    again = connect.write_config("codex", QWEN, tmp_path)  # the same settings again
    assert not again.changed and again.backup is None and len(backups(path)) == 2
    connect.write("codex", SMOL, tmp_path)  # back to a node without a key
    assert "env_key" not in tomllib.loads(path.read_text())["model_providers"]["shoal"]


def test_a_new_file_is_the_printed_settings_only_the_user_may_read_and_has_no_backup(
        tmp_path):
    written = connect.write_config("codex", SMOL, tmp_path)
    assert written.path.read_text() == connect.codex_toml(SMOL) and written.backup is None
    assert stat.S_IMODE(written.path.stat().st_mode) == 0o600
    assert backups(written.path) == []


def test_the_files_permissions_are_kept_and_the_backup_has_them_too(tmp_path):
    path = users_file(tmp_path, "continue", CONTINUE)
    path.chmod(0o640)
    written = connect.write_config("continue", SMOL, tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert stat.S_IMODE(written.backup.stat().st_mode) == 0o640


def test_a_config_linked_from_a_dotfiles_folder_stays_a_link(tmp_path):
    real = tmp_path / "dotfiles" / "codex.toml"
    real.parent.mkdir()
    real.write_text(CODEX)
    link = connect.config_path("codex", tmp_path)
    link.parent.mkdir()
    link.symlink_to(real)
    connect.write("codex", SMOL, tmp_path)
    assert link.is_symlink() and tomllib.loads(real.read_text())["model_provider"] == "shoal"
    assert [p.read_text() for p in backups(link)] == [CODEX]


def test_claude_keeps_the_users_settings_and_layout(tmp_path):
    path = users_file(tmp_path, "claude", CLAUDE)
    written = connect.write_config("claude", SMOL, tmp_path)
    text = path.read_text()
    settings = json.loads(text)  # still strict JSON
    assert settings["theme"] == "dark" and settings["hooks"] == {}
    assert settings["permissions"] == {"allow": ["Bash(ls:*)", "Read"]}
    assert settings["env"]["MY_VAR"] == "1"
    assert settings["env"] == {"MY_VAR": "1", **connect.claude_env(SMOL)}
    assert '    "permissions": {"allow": ["Bash(ls:*)", "Read"]},' in text  # as it was
    assert '        "ANTHROPIC_BASE_URL": "http://127.0.0.1:8421",' in text  # its indent
    assert written.backup.read_text() == CLAUDE


def test_claude_with_a_key_reads_it_from_the_environment_and_sends_no_other_token(tmp_path):
    path = users_file(tmp_path, "claude", CLAUDE)
    connect.write("claude", SMOL, tmp_path)  # sets ANTHROPIC_AUTH_TOKEN=shoal
    connect.write("claude", QWEN, tmp_path)
    settings = json.loads(path.read_text())
    assert settings["apiKeyHelper"] == f"printenv {connect.KEY_ENV}"
    assert "ANTHROPIC_AUTH_TOKEN" not in settings["env"]
    assert settings["env"]["ANTHROPIC_BASE_URL"] == "http://10.0.0.2:8421"
    connect.write("claude", SMOL, tmp_path)  # a node without a key: our helper goes
    settings = json.loads(path.read_text())
    assert "apiKeyHelper" not in settings and settings["env"]["ANTHROPIC_AUTH_TOKEN"] == "shoal"
    assert settings["theme"] == "dark" and len(backups(path)) == 3


@pytest.mark.parametrize("name", ["opencode.jsonc", "opencode.json"])
def test_opencode_keeps_the_users_comments_and_trailing_commas(tmp_path, name):
    path = users_file(tmp_path, "opencode", OPENCODE, name=name)
    written = connect.write_config("opencode", SMOL, tmp_path)
    assert written.path == path  # an existing opencode.jsonc is the one edited
    assert sorted(p.name for p in path.parent.iterdir() if not BACKUP.search(p.name)) == [name]
    text = path.read_text()
    for comment in ("// my OpenCode setup", "/* the dark one */", "/* my local Ollama */",
                    "// I update by hand"):
        assert comment in text
    assert kept_lines(OPENCODE, text)  # added to, nothing of the user's changed
    cfg = jsonc_loads(text)
    fresh = connect.opencode_json(SMOL)
    assert cfg["provider"]["shoal"] == fresh["provider"]["shoal"]
    assert cfg["provider"]["ollama"]["options"] == {"baseURL": "http://localhost:11434/v1"}
    assert cfg["model"] == fresh["model"] and cfg["compaction"] == fresh["compaction"]
    assert cfg["theme"] == "tokyonight" and cfg["autoupdate"] is False
    assert written.backup.read_text() == OPENCODE


def test_continue_keeps_the_users_models_and_comments(tmp_path):
    path = users_file(tmp_path, "continue", CONTINUE)
    connect.write("continue", SMOL, tmp_path)
    first = path.read_text()
    assert kept_lines(CONTINUE, first)
    cfg = yaml.safe_load(first)
    assert [m["name"] for m in cfg["models"]] == ["GPT-4o", "Llama", "Shoal",
                                                 "Shoal autocomplete"]
    assert cfg["name"] == "My Assistant" and cfg["context"] == [{"provider": "code"}]
    assert "# code context\ncontext:" in first  # still above what it was about
    # another model: Shoal's entries change in place, the user's stay as they were
    connect.write("continue", QWEN, tmp_path)
    cfg = yaml.safe_load(path.read_text())
    assert [m["name"] for m in cfg["models"]] == ["GPT-4o", "Llama", "Shoal",
                                                 "Shoal autocomplete"]
    shoal = {m["name"]: m for m in cfg["models"]}["Shoal"]
    assert shoal["model"] == "Qwen3-8B" and shoal["apiBase"] == "http://10.0.0.2:8421/v1"
    assert shoal["defaultCompletionOptions"]["contextLength"] == 32768
    assert cfg["models"][:2] == yaml.safe_load(CONTINUE)["models"]
    assert kept_lines(CONTINUE, path.read_text())
    assert {p.read_text() for p in backups(path)} == {CONTINUE, first}


def test_a_continue_file_with_only_comments_keeps_them(tmp_path):
    path = users_file(tmp_path, "continue", "# nothing yet\n")
    connect.write("continue", SMOL, tmp_path)
    assert path.read_text() == "# nothing yet\n" + connect.continue_yaml(SMOL)


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """`shoal connect AGENT --write` for a node that has SMOL, in a home of the test's."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(connect, "target", lambda url, model, key, agent=None: SMOL)

    def run(agent):
        code = main(["connect", agent, "--write"])
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


BROKEN = {"codex": 'model = "gpt-5\n[profiles.fast\n',
          "claude": '{"theme": "dark",\n "env": {"A": 1}\n',
          "opencode": '{\n  // mine\n  "theme": "dark"\n  "model": "x"\n}\n',
          "continue": "models:\n  - name: A\n   provider: openai\n  bad: [\n"}


@pytest.mark.parametrize("agent", connect.AGENTS)
def test_a_file_it_cant_parse_is_left_alone_with_a_message(cli, tmp_path, agent):
    path = users_file(tmp_path, agent, BROKEN[agent])
    code, out, err = cli(agent)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert str(path) in err and "fix it, or move it aside" in err
    assert path.read_text() == BROKEN[agent] and backups(path) == []


@pytest.mark.parametrize(("agent", "text"), [
    ("codex", "model_providers = 3\n"),
    ("claude", '{"env": "all of it"}'),
    ("opencode", '{"provider": ["shoal"]}'),
    ("continue", "models: all of them\n"),
])
def test_a_setting_of_the_wrong_shape_is_not_replaced(cli, tmp_path, agent, text):
    path = users_file(tmp_path, agent, text)
    code, _, err = cli(agent)
    assert code == 1 and str(path) in err and path.read_text() == text


def test_the_command_says_where_the_old_file_is_kept_and_when_nothing_changed(cli, tmp_path):
    path = users_file(tmp_path, "codex", CODEX)
    code, out, _ = cli("codex")
    assert code == 0 and f"to {path}; the file as it was is kept as {path.name}." in out
    code, out, _ = cli("codex")
    assert code == 0 and "nothing changed" in out and len(backups(path)) == 1
