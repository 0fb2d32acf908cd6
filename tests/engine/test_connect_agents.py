"""Every setting `shoal connect` writes is one the agent's pinned release reads: each name
is looked up in the installed agent's own code (.agents/node_modules, from the npm
registry: Claude Code's, Codex's and OpenCode's binaries, Continue's bundled JS), and so is
the compaction arithmetic engine/connect_fit.py copies from it. A new release that renames
a setting or changes the arithmetic fails here: re-read its code, then update connect_fit.
Skipped where the agent isn't installed (scripts/setup installs them)."""

from __future__ import annotations

import json
import mmap
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from engine import connect
from engine.connect import Target

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agent_tools import PACKAGES, ROOT, version  # noqa: E402

MODULES = ROOT / ".agents" / "node_modules"
# Where each package keeps its code (the native binaries come in per-platform packages).
CODE = {"claude": ["@anthropic-ai/claude-code*/**/claude*"],
        "codex": ["@openai/codex*/vendor/*/bin/codex"],
        "opencode": ["opencode-*/bin/opencode"],
        "continue": ["@continuedev/cli/dist/index.js"]}
SMALL, BIG = Target("http://h:1", "m", 40960), Target("http://h:1", "m", 131072)


def agent_code(agent: str) -> list[Path]:
    """The installed agent's code files (of the pinned version), or a skip."""
    pkg = MODULES / PACKAGES[agent] / "package.json"
    if not pkg.is_file():
        pytest.skip(f"{agent} is not installed: scripts/setup installs it with npm")
    assert json.loads(pkg.read_text())["version"] == version(agent), "not the pinned release"
    files = [p for g in CODE[agent] for p in MODULES.glob(g)
             if p.is_file() and p.stat().st_size > 1 << 20]
    if not files:
        pytest.skip(f"{agent}'s code for this platform is not installed")
    return files


def missing(agent: str, names: set[str]) -> set[str]:
    """The names that appear in none of the agent's code files."""
    left = set(names)
    for path in agent_code(agent):
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            left = {n for n in left if m.find(n.encode()) < 0}
    return left


def keys(value: object, skip: set[str]) -> set[str]:
    """Every key of a nested settings value (not the model's or provider's own name)."""
    if isinstance(value, dict):
        return {k for k in value if k not in skip} | {
            n for v in value.values() for n in keys(v, skip)}
    if isinstance(value, list):
        return {n for v in value for n in keys(v, skip)}
    return set()


def test_claude_code_reads_every_variable_and_compacts_as_connect_fit_says():
    written = set(connect.claude_env(SMALL)) | set(connect.claude_env(BIG)) | {"apiKeyHelper"}
    assert missing("claude", written) == set()
    assert missing("claude", {
        # CLAUDE_CODE_MAX_CONTEXT_TOKENS is the window of a model it doesn't know
        "let y=s.CLAUDE_CODE_MAX_CONTEXT_TOKENS;if(y!==void 0&&y>0)return y",
        'O9n("CLAUDE_CODE_MAX_OUTPUT_TOKENS",process.env.CLAUDE_CODE_MAX_OUTPUT_TOKENS',
        # it compacts at the window less min(max output, 20,000) less 13,000 ...
        "function gse(e,n){let o=Math.min(e.maxOutputTokens,kfo)", "kfo=20000",
        "function QG(e,n){let o=e-$Ue", "$Ue=13000",
        # ... and reads an auto-compact window under 100k as 100k
        'if(g<iF)return{kind:"below_minimum"', "iF=1e5",
        "so Claude Code treats it as the"}) == set()


def test_codex_reads_every_setting_written():
    cfg = tomllib.loads(connect.codex_toml(Target("http://h:1", "m", 40960, needs_key=True)))
    written = keys(cfg, {"shoal"}) | {cfg["model_providers"]["shoal"]["wire_api"]}
    assert missing("codex", written | {"model_auto_compact_token_limit"}) == set()


def test_opencode_reads_every_setting_written_and_compacts_at_context_less_output():
    written = keys(connect.opencode_json(SMALL), {"shoal", "m", "$schema"})
    assert missing("opencode", written) == set()
    assert missing("opencode", {  # compaction.reserved counts only with a limit.input
        "e.model.limit.input?Math.max(0,e.model.limit.input-l):"
        "Math.max(0,o-ue.maxOutputTokens(e.model,e.outputTokenMax))",
        "limit:r.Struct({context:r.Finite,input:r.optional(r.Finite),output:r.Finite"}) \
        == set()


def test_continue_reads_every_setting_written_and_compacts_as_connect_fit_says():
    written = keys(yaml.safe_load(connect.continue_yaml(SMALL)), set())
    assert missing("continue", written) == set()
    assert missing("continue", {
        "defaultCompletionOptions?.contextLength", "defaultCompletionOptions?.maxTokens",
        # the window less maxTokens less min(max(maxTokens, 20% of the rest), 15,000)
        "u=Math.ceil((1-Uti)*(s-a)),l=Math.max(a,u),c=Math.min(l,Oti),d=s-a-c",
        "Oti=15e3,Uti=.8"}) == set()
