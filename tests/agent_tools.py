"""Real coding agents (from the npm registry, pinned in .agents/package.json and installed
by scripts/setup) driven non-interactively against a real node, and the recording of
what they send: a proxy in front of the node keeps every request and answer, so one run
can be saved into tests/fixtures/agents/ and replayed in seconds by fast tests."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".agents" / "node_modules" / ".bin"
FIXTURES = ROOT / "tests" / "fixtures" / "agents"
PINNED = json.loads((ROOT / ".agents" / "package.json").read_text())["dependencies"]
COMMANDS = {"claude": "claude", "codex": "codex", "opencode": "opencode", "continue": "cn"}
PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex",
            "opencode": "opencode-ai", "continue": "@continuedev/cli"}


def agent_bin(agent: str) -> Path | None:
    p = BIN / COMMANDS[agent]
    return p if p.exists() else None


def version(agent: str) -> str:
    return str(PINNED[PACKAGES[agent]])


@dataclass
class Exchange:
    """One request an agent sent, and what the node answered."""
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    status: int = 0
    answer: str = ""

    def json(self) -> dict[str, Any]:
        return {"method": self.method, "path": self.path, "headers": self.headers,
                "body": self.body, "status": self.status}


class Recorder:
    """An HTTP proxy on loopback (in a thread of this process) that forwards to `target`
    and keeps every exchange. Secrets (Authorization, x-api-key) are never kept."""

    def __init__(self, target: str):
        self.target = target.rstrip("/")
        self.exchanges: list[Exchange] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.port = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the recording proxy didn't start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        from aiohttp import ClientSession, ClientTimeout, web

        async def handle(request: web.Request) -> web.StreamResponse:
            raw = await request.read()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode(errors="replace")
            ex = Exchange(request.method, request.path_qs, {
                k: v for k, v in request.headers.items()
                if k.lower() not in ("authorization", "x-api-key", "cookie")}, body)
            self.exchanges.append(ex)
            headers = {k: v for k, v in request.headers.items()
                       if k.lower() not in ("host", "content-length", "accept-encoding")}
            async with ClientSession(timeout=ClientTimeout(total=600)) as s, \
                    s.request(request.method, self.target + request.path_qs, data=raw,
                              headers=headers) as up:
                resp = web.StreamResponse(status=up.status, headers={
                    "Content-Type": up.headers.get("Content-Type", "application/json")})
                await resp.prepare(request)
                chunks = []
                async for c in up.content.iter_any():
                    chunks.append(c)
                    await resp.write(c)
                ex.status, ex.answer = up.status, b"".join(chunks).decode(errors="replace")
                await resp.write_eof()
                return resp

        async def start() -> None:
            app = web.Application(client_max_size=64 << 20)
            app.router.add_route("*", "/{tail:.*}", handle)
            runner = self._runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._ready.set()

        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(start())
        self._loop.run_forever()

    def close(self) -> None:
        done = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
        done.result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def model_requests(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.method == "POST" and "/count_tokens" not in
                e.path and any(p in e.path for p in ("/messages", "/responses",
                                                      "/chat/completions"))]

    def save(self, name: str) -> Path:
        """The recorded requests as tests/fixtures/agents/NAME.json."""
        FIXTURES.mkdir(parents=True, exist_ok=True)
        path = FIXTURES / f"{name}.json"
        path.write_text(json.dumps([e.json() for e in self.exchanges], indent=1) + "\n")
        return path


def fresh_home(tmp: Path) -> Path:
    """A home folder with nothing of the user's: the agents' config, caches and logins
    live there."""
    home = tmp / "agent-home"
    home.mkdir(parents=True, exist_ok=True)
    return home


def run(agent: str, prompt: str, home: Path, workdir: Path, env: dict[str, str],
        timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`agent` once, non-interactively, with `prompt`; a tool it calls runs in `workdir`."""
    exe = agent_bin(agent)
    assert exe is not None
    args = {"claude": [str(exe), "-p", prompt, "--allowedTools", "Bash"],
            "codex": [str(exe), "exec", "--skip-git-repo-check", prompt],
            "opencode": [str(exe), "run", prompt],
            "continue": [str(exe), "-p", prompt, "--config",
                         str(home / ".continue" / "config.yaml")]}[agent]
    base = {k: v for k, v in os.environ.items()
            if k in ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR", "SHELL")}
    full = {**base, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
            "CODEX_HOME": str(home / ".codex"), "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1", "NO_COLOR": "1", **env}
    workdir.mkdir(parents=True, exist_ok=True)
    return subprocess.run(args, cwd=workdir, env=full, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def npm() -> str | None:
    return shutil.which("npm")
