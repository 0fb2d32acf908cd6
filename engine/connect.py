"""Settings that point a coding agent at a node: `shoal connect claude|codex|opencode|
continue` prints them (or, with --write, sets them in the agent's own config file, keeping
the user's other settings and comments: see engine.connect_files).

Each agent gets the node's address, the model for every tier it has, the model's real
context window, how long an answer may be and when to compact (so it neither overruns the
window nor compacts a quarter of the way in, as it does for model names it doesn't know),
and the switches that keep the prefix cache warm. Which model: one whose window holds the
agent's own prompt (engine.connect_fit), or a sentence saying which to download. A key
never goes into a file: an agent that needs one reads it from the SHOAL_API_KEY
environment variable."""

from __future__ import annotations

import json
import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.connect_fit import CLAUDE_MIN_WINDOW, COMPACT_AT, about, max_output

if TYPE_CHECKING:
    from engine.connect_files import Written

AGENTS = ("claude", "codex", "opencode", "continue")
KEY_ENV = "SHOAL_API_KEY"


@dataclass(frozen=True)
class Target:
    url: str  # the node's base address, e.g. http://127.0.0.1:8421 (no /v1)
    model: str
    context: int
    needs_key: bool = False
    note: str = ""  # what else the node has for the agent, said with the settings

    @property
    def compact_at(self) -> int:
        return int(self.context * COMPACT_AT)

    @property
    def max_output(self) -> int:
        return max_output(self.context)


def claude_env(t: Target) -> dict[str, str]:
    """Claude Code's environment (also the "env" block of ~/.claude/settings.json)."""
    env = {"ANTHROPIC_BASE_URL": t.url,
           "ANTHROPIC_AUTH_TOKEN": f"${KEY_ENV}" if t.needs_key else "shoal",
           "ANTHROPIC_MODEL": t.model, "ANTHROPIC_DEFAULT_OPUS_MODEL": t.model,
           "ANTHROPIC_DEFAULT_SONNET_MODEL": t.model,
           "ANTHROPIC_DEFAULT_HAIKU_MODEL": t.model, "ANTHROPIC_SMALL_FAST_MODEL": t.model,
           "CLAUDE_CODE_SUBAGENT_MODEL": t.model,
           # it assumes 200K or 1M for a name it doesn't know: say the real window; it
           # compacts at that less min(this, 20,000) less 13,000 (its default, 32,000,
           # leaves a small window no room)
           "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(t.context),
           "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(t.max_output),
           # no per-request billing header at the top of the system prompt (Shoal drops
           # it too), and no calls to Anthropic's servers for telemetry or updates
           "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    if t.context >= CLAUDE_MIN_WINDOW:  # under it, it warns and reads it as 100k
        env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] = str(t.context)
    return env


def codex_toml(t: Target) -> str:
    """~/.codex/config.toml: a provider for the node over the Responses API."""
    lines = [f"model = {_toml(t.model)}", 'model_provider = "shoal"',
             f"model_context_window = {t.context}",
             f"model_auto_compact_token_limit = {t.compact_at}", "",
             "[model_providers.shoal]", 'name = "Shoal"', f"base_url = {_toml(t.url + '/v1')}",
             'wire_api = "responses"']
    if t.needs_key:
        lines.append(f'env_key = "{KEY_ENV}"')
    return "\n".join(lines) + "\n"


def opencode_json(t: Target) -> dict[str, Any]:
    """OpenCode's config (~/.config/opencode/opencode.json): an OpenAI-compatible
    provider, the model's limits, and auto-compaction."""
    return {"$schema": "https://opencode.ai/config.json",
            "provider": {"shoal": {
                "npm": "@ai-sdk/openai-compatible", "name": "Shoal",
                "options": {"baseURL": f"{t.url}/v1",
                            "apiKey": f"{{env:{KEY_ENV}}}" if t.needs_key else "shoal"},
                "models": {t.model: {"name": t.model, "limit": {
                    "context": t.context, "output": t.max_output}}}}},
            "model": f"shoal/{t.model}",
            # it compacts at limit.context less limit.output ("reserved" counts only
            # with a limit.input, which would cap the prompt)
            "compaction": {"auto": True}}


def continue_yaml(t: Target) -> str:
    """Continue's ~/.continue/config.yaml: the model for chat, edit, apply and
    autocomplete, with its context length."""
    key = f"${{{{ secrets.{KEY_ENV} }}}}" if t.needs_key else "shoal"
    out = ["name: Shoal", "version: 1.0.0", "schema: v1", "models:"]
    for name, roles in (("Shoal", "[chat, edit, apply]"),
                        ("Shoal autocomplete", "[autocomplete]")):
        out += [f"  - name: {name}", "    provider: openai", f"    model: {_yaml(t.model)}",
                f"    apiBase: {_yaml(t.url + '/v1')}", f"    apiKey: {key}",
                f"    roles: {roles}",
                "    defaultCompletionOptions:", f"      contextLength: {t.context}",
                f"      maxTokens: {t.max_output}"]
    return "\n".join(out) + "\n"


def config_path(agent: str, home: Path) -> Path:
    return {"claude": home / ".claude" / "settings.json",
            "codex": home / ".codex" / "config.toml",
            "opencode": home / ".config" / "opencode" / "opencode.json",
            "continue": home / ".continue" / "config.yaml"}[agent]


def render(agent: str, t: Target) -> str:
    """What `shoal connect AGENT` prints: the settings and where they go."""
    key = f"\n# the node needs a key: export {KEY_ENV}=<your key> first" if t.needs_key else ""
    said = f"{t.model}: {about(agent, t.context)}. {t.note}".strip()
    key += "".join(f"\n# {line}" for line in textwrap.wrap(said, 88, break_on_hyphens=False))
    if agent == "claude":
        env = claude_env(t)
        exports = "\n".join(f"export {k}={_shell(v)}" for k, v in env.items())
        if "CLAUDE_CODE_AUTO_COMPACT_WINDOW" not in env:
            exports += "\nunset CLAUDE_CODE_AUTO_COMPACT_WINDOW"
        return f"# Claude Code: in your shell, then run `claude`{key}\n{exports}\n"
    text = {"codex": codex_toml, "continue": continue_yaml}.get(agent)
    body = text(t) if text else json.dumps(opencode_json(t), indent=2) + "\n"
    return f"# {agent}: {config_path(agent, Path('~'))}{key}\n{body}"


def _shell(v: str) -> str:
    """A value `eval` reads back as it is, whatever a node named its model; only the
    key's own "$SHOAL_API_KEY" is left for the shell to expand."""
    return v if v == f"${KEY_ENV}" else shlex.quote(v)


def _toml(v: str) -> str:
    return json.dumps(v)  # a JSON string (ASCII, escaped) is a TOML basic string


def _yaml(v: str) -> str:
    return json.dumps(v)  # quoted: a name like 1.5, null or "a: b" stays a string


def write(agent: str, t: Target, home: Path) -> Path:
    """Set the agent's settings in its config file (see write_config); the file's path."""
    return write_config(agent, t, home).path


def write_config(agent: str, t: Target, home: Path) -> Written:
    """Set Shoal's settings in the agent's own config file and nothing else of it: the
    user's other settings, comments and layout stay, the file as it was is kept beside it
    as NAME.<date>.bak, and a file that can't be parsed is left alone (ConfigFileError)."""
    from engine.connect_files import update
    path = config_path(agent, home)
    if agent == "opencode" and path.with_suffix(".jsonc").is_file():
        path = path.with_suffix(".jsonc")  # OpenCode reads it last, so its settings win
    kind = {"claude": "JSON", "codex": "TOML", "opencode": "JSONC", "continue": "YAML"}
    edit = {"claude": _claude_settings, "codex": _codex_config,
            "opencode": _opencode_config, "continue": _continue_config}[agent]
    return update(path, kind[agent], lambda text: edit(text, t))


def _claude_settings(text: str | None, t: Target) -> str:
    from engine import connect_jsonc as jsonc
    env, helper = claude_env(t), f"printenv {KEY_ENV}"
    if t.needs_key:  # the key stays in the environment: the helper reads it there
        env.pop("ANTHROPIC_AUTH_TOKEN")
    if text is None or not text.strip():
        return json.dumps({**({"apiKeyHelper": helper} if t.needs_key else {}), "env": env},
                          indent=2) + "\n"
    text = jsonc.merge(text, ["env"], env)
    if "CLAUDE_CODE_AUTO_COMPACT_WINDOW" not in env:  # one written for a larger model
        text = jsonc.remove(text, ["env", "CLAUDE_CODE_AUTO_COMPACT_WINDOW"])
    if t.needs_key:  # a token left there would be sent to the node instead
        text = jsonc.remove(text, ["env", "ANTHROPIC_AUTH_TOKEN"])
        return jsonc.set_value(text, ["apiKeyHelper"], helper)
    if jsonc.loads(text).get("apiKeyHelper") == helper:  # ours, for a node with a key
        text = jsonc.remove(text, ["apiKeyHelper"])
    return text


def _opencode_config(text: str | None, t: Target) -> str:
    from engine import connect_jsonc as jsonc
    if text is None or not text.strip():
        return json.dumps(opencode_json(t), indent=2) + "\n"
    return jsonc.merge(text, [], opencode_json(t))


def _codex_config(text: str | None, t: Target) -> str:
    from engine.connect_files import merge_toml
    if text is None or not text.strip():
        return codex_toml(t)
    drop = [] if t.needs_key else [("model_providers", "shoal", "env_key")]
    return merge_toml(text, codex_toml(t), drop)


def _continue_config(text: str | None, t: Target) -> str:
    from engine.connect_files import merge_yaml_list
    if text is None or not text.strip():
        return continue_yaml(t)
    return merge_yaml_list(text, continue_yaml(t), "models", by="name")


def target(url: str, model: str | None, key: str | None, agent: str | None = None) -> Target:
    """The node at `url` and the model to use, read from the node itself: the one asked
    for, else (for an agent) the loaded model or one on the node's disk whose window holds
    the agent's own prompt, else the loaded one, else the first it has. Where no model
    there holds the agent, NoRoom says which to download."""
    import httpx

    from engine.connect_fit import NoRoom, choose
    from engine.errors import ModelNotFound, PeerUnreachable

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    base = url.rstrip("/").removesuffix("/v1")

    def get(path: str) -> httpx.Response:
        return httpx.get(f"{base}{path}", headers=headers, timeout=30)
    try:
        r, status = get("/v1/models"), get("/shoal/status")
    except httpx.HTTPError as e:
        raise PeerUnreachable(f"No node answers at {base} ({e}); start one with "
                              "`shoal node` or the app, or give --url.") from None
    if r.status_code == 401:
        raise PeerUnreachable(f"The node at {base} needs its API key: export {KEY_ENV}=KEY "
                              "and run this again.")
    try:
        models, loaded = _models(r, status)
    except (ValueError, TypeError, KeyError, AttributeError):
        raise PeerUnreachable(f"{base} answered /v1/models with something that isn't a "
                              "Shoal node's list of models; is --url a Shoal node?") from None
    ids = [m.id for m in models]
    if model is not None and model not in ids or not ids:
        raise ModelNotFound(f"The node at {base} has no model {model or ''}; models there: "
                            f"{', '.join(ids) or 'none'}.", param="model")
    if agent is None:
        name = model or loaded or ids[0]
        found = next(m for m in models if m.id == name)
        return Target(base, name, found.context or 32768, needs_key=bool(key))
    try:
        chosen = choose(agent, models, model)
    except NoRoom:
        choose(agent, models, model, _catalog(get))  # the same, naming what to download
        raise
    return Target(base, chosen.id, chosen.context or 0, needs_key=bool(key),
                  note=_note(agent, chosen, models))


def _note(agent: str, chosen: Any, models: list[Any]) -> str:
    """Whether the node has the chosen model loaded, and the others there that hold the
    agent too."""
    from engine.connect_fit import holds
    others = [f"{m.id} ({m.context:,})" for m in models
              if m.id != chosen.id and holds(agent, m.context)]
    note = "" if chosen.loaded else \
        "It isn't loaded: the node loads it at the agent's first request."
    if others:
        note += f" Others here that hold the agent: {', '.join(others)} (--model NAME)."
    return note.strip()


def _models(r: Any, status: Any) -> tuple[list[Any], str | None]:
    """The node's models (with the loaded one's real window), and the loaded one's id."""
    from dataclasses import replace

    from engine.connect_fit import Model
    from engine.hub.names import model_id_problem
    from engine.records import ModelCard, RunnerReady, StatusInfo

    # a name that can't be a model on a node (a control character, ...) is a hostile
    # node's: it never reaches a file or the shell
    cards = [ModelCard.from_json(d) for d in r.json().get("data", [])
             if isinstance(d, dict) and model_id_problem(d.get("id")) is None]
    info = StatusInfo.from_json(status.json()) if status.is_success else None
    loaded = info.model if info and info.model in {c.id for c in cards} else None
    runner = info.runner if info else None
    models = [Model(c.id, c.shoal.context_length, c.id == loaded or c.shoal.instance is not None,
                    c.shoal.size_bytes) for c in cards]
    if isinstance(runner, RunnerReady) and runner.model == loaded:  # the window it runs
        models = [replace(m, context=runner.context_length) if m.id == loaded else m
                  for m in models]
    return models, loaded


def _catalog(get: Any) -> list[Any]:
    """The models the node's catalog offers to download, with whether each fits its
    memory (the catalog file alone, fit unknown, from a node that can't say)."""
    import httpx

    from engine.connect_fit import Model
    from engine.records import CatalogInfo
    try:
        r = get("/shoal/hub/catalog")
        entries = CatalogInfo.from_json(r.json()).models if r.is_success else None
    except (httpx.HTTPError, ValueError):
        entries = None
    if entries is None:
        from engine.hub.catalog import load_catalog
        entries = list(load_catalog())
    return [Model(e.id, e.context_length, size_bytes=e.size_bytes, fits_memory=e.fits)
            for e in entries if not e.local]
