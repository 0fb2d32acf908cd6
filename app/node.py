"""Find the local node, or start one as a child process, and stop it again at quit.

A node that was already answering belongs to someone else and is left alone; a node we
started is stopped politely (shutdown request), then terminated, then killed, and always
reaped, each step with a time bound, so quitting never leaves a process behind.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from engine.client import NodeClient
from engine.errors import ShoalError
from engine.net import DEFAULT_PORT
from engine.paths import ensure, logs_dir

log = logging.getLogger(__name__)

LOG_NAME = "node-child.log"


class NodeStartError(ShoalError):
    """The local node didn't come up; `log_tail` holds the end of its output."""

    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(message)
        self.log_tail = log_tail


def node_command(host: str, port: int, home: Path) -> list[str]:
    return [sys.executable, "-m", "engine.cli", "node", "--host", host,
            "--port", str(port), "--home", str(home)]


class LocalNode:
    """The node on this machine. start() blocks (run it through Tasks); stop() is bounded."""

    def __init__(self, home: Path, port: int = DEFAULT_PORT, host: str = "127.0.0.1",
                 command: list[str] | None = None, start_timeout: float = 60.0,
                 api_key: str | None = None):
        self.home = Path(home)
        self.host, self.port = host, port  # host: where the node serves its API
        self.url = reach_url(host, port)
        self.command = command or node_command(host, port, self.home)
        self.api_key = api_key
        self.start_timeout = start_timeout
        self.log_path = logs_dir(self.home) / LOG_NAME
        self.proc: subprocess.Popen | None = None
        self.client = NodeClient(self.url, api_key=api_key)
        self._lock = threading.Lock()  # guards proc against a stop() during start()
        self._stopping = threading.Event()

    @property
    def started_by_us(self) -> bool:
        return self.proc is not None

    def _answers(self) -> bool:
        try:
            with NodeClient(self.url, timeout=1.0) as probe:
                probe.health()
            return True
        except ShoalError:
            return False

    def start(self, note: str = "") -> LocalNode:
        """Use the node answering at url, or start one and wait for /health. Raises
        NodeStartError with the node's log tail when it exits or doesn't answer in time.
        With a `note` (a restart's reason) the log is kept and the note written under it,
        so the end of the node that stopped stays readable."""
        if self._answers():
            log.info("Using the node already running at %s", self.url)
            return self
        ensure(self.log_path.parent)
        with self._lock:
            if self._stopping.is_set():
                raise NodeStartError("Shoal is quitting; the node was not started.")
            log.info("Starting the local node: %s", " ".join(self.command))
            with open(self.log_path, "ab" if note else "wb") as out:
                if note:
                    out.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} {note} ---\n"
                              .encode())
                    out.flush()
                # Its own process group, so a stuck worker can be stopped with the node.
                # The key goes by environment, not argv, so `ps` doesn't show it.
                env = {**os.environ, **({"SHOAL_API_KEY": self.api_key} if self.api_key
                                        else {})}
                from app.settings import (
                    saved_allowed_hosts,
                    saved_cors_origins,
                    saved_drafting_env,
                )
                env |= saved_drafting_env(self.home)  # Settings → API: drafting
                # the node keeps its whole log in node.log (rotated); this file, which
                # can't rotate, gets only its warnings and errors
                env.setdefault("SHOAL_CONSOLE_LOG", "warning")
                cors = saved_cors_origins(self.home)  # Settings → API
                if cors:
                    env["SHOAL_CORS_ORIGINS"] = ",".join(cors)
                hosts = saved_allowed_hosts(self.home)
                if hosts:
                    env["SHOAL_ALLOWED_HOSTS"] = ",".join(hosts)
                self.proc = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=env,
                                             start_new_session=os.name == "posix")
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._stopping.is_set():
                raise NodeStartError("Shoal is quitting; the node start was abandoned.")
            code = self.proc.poll()
            if code is not None:
                raise NodeStartError(self._exit_reason(code), self.log_tail())
            if self._answers():
                log.info("The local node answers at %s", self.url)
                return self
            time.sleep(0.2)
        self._reap(kill_after=3.0)
        raise NodeStartError(f"Shoal's engine on this computer didn't answer within "
                             f"{self.start_timeout:.0f} s of starting, so Shoal stopped it. "
                             f"Its log (below) may say why.", self.log_tail())

    def _exit_reason(self, code: int) -> str:
        if _port_taken(self.host, self.port):
            return (f"Port {self.port} on {self.host} is in use by another program, so the "
                    f"node couldn't start: {how_it_ended(code)}. Quit that program, or "
                    f"start Shoal with --port and a free port.")
        return f"Shoal's engine stopped while starting ({how_it_ended(code)})."

    def restart(self, note: str, polite: bool = False,
                to: tuple[str, int, str | None] | None = None) -> LocalNode:
        """Stop what is left of the node we started (and its workers), then start it
        again; `note` goes into its log. Blocks like start(). `polite`: a running node is
        asked to shut down first (the user restarts it), as at quit. `to`: the new
        (host, port, api_key) it serves with (Settings → API)."""
        if polite:
            self._ask_to_stop(self.proc, wait=5.0)
        self._reap(kill_after=3.0)
        with self._lock:
            self.proc = None  # whoever answers next may not be ours
        if to is not None:
            self._move(*to)
        return self.start(note)

    def _move(self, host: str, port: int, api_key: str | None) -> None:
        self.host, self.port, self.api_key = host, port, api_key
        self.url = reach_url(host, port)
        given = dict(zip(self.command, self.command[1:]))
        if "--host" in given and "--port" in given:  # a command that names them moves too
            new = {"--host": host, "--port": str(port)}
            self.command = [new.get(before, arg) for before, arg in
                            zip(["", *self.command], self.command)]
        self.client.retarget(self.url, api_key)

    def watch(self, stop: threading.Event, hang_after: float = 5.0,
              gone_after: float = 2.0) -> str | None:
        """Block until the node stops being there; returns how, in a few words ('it was
        forced to quit, signal 9', 'not answering for 5 s'), or None once `stop` is set. A node we
        started is checked 4 times a second and counted dead when it exits or hasn't
        answered /health for `hang_after` s (a busy node still answers); one we didn't
        start is gone once it hasn't answered for `gone_after` s."""
        proc = self.proc
        silent_for = hang_after if proc is not None else gone_after
        last_answer = next_probe = time.monotonic()
        with NodeClient(self.url, timeout=1.0) as probe:
            while not stop.wait(0.25):
                if proc is not None and proc.poll() is not None:
                    return how_it_ended(proc.returncode)
                now = time.monotonic()
                if now < next_probe:
                    continue
                next_probe = now + 1.0
                try:
                    probe.health()
                    last_answer = time.monotonic()
                except ShoalError:
                    if time.monotonic() - last_answer >= silent_for:
                        return f"not answering for {silent_for:.0f} s"
        return None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the node if we started it (a node that was already running is left alone)."""
        self._stopping.set()
        with self._lock:
            proc = self.proc
        self._ask_to_stop(proc, wait=max(timeout - 5.0, 1.0))
        self._reap(kill_after=3.0)
        self.client.close()

    def _ask_to_stop(self, proc: subprocess.Popen | None, wait: float) -> None:
        """Ask a running node of ours to shut down (its workers stop cleanly) and wait up
        to `wait` s; _reap terminates whatever is left."""
        if proc is None or proc.poll() is not None:
            return
        try:
            with NodeClient(self.url, api_key=self.api_key, timeout=2.0) as c:
                c.shutdown()
            proc.wait(timeout=wait)
        except ShoalError as e:
            log.info("Shutdown request not answered (%s); terminating the node.", e)
        except subprocess.TimeoutExpired:
            log.warning("The node didn't stop when asked; terminating it.")

    def _reap(self, kill_after: float) -> None:
        """terminate, then kill, then wait: the node is gone and reaped afterwards, and so
        is anything left in its process group (a worker that outlived it)."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=kill_after)
            except subprocess.TimeoutExpired:
                log.warning("The node ignored SIGTERM; killing it.")
                proc.kill()
                proc.wait(timeout=5.0)
        if os.name == "posix":
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # the usual case: nothing left


def reach_url(host: str, port: int) -> str:
    """Where this machine reaches a node serving on host:port (one serving on every
    interface is reached on loopback)."""
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{port}"


SIGNAL_WORDS = {9: "it was forced to quit", 15: "it was asked to quit", 11: "it crashed",
                6: "it aborted", 7: "it crashed", 4: "it crashed"}


def how_it_ended(code: int) -> str:
    """How a process ended in a person's words, the number kept for a search: 'it was
    forced to quit, signal 9', 'it exited with error code 1', from a Popen return code."""
    if code < 0:
        return f"{SIGNAL_WORDS.get(-code, 'it was stopped')}, signal {-code}"
    return f"it exited with error code {code}" if code else "it exited"


def _port_taken(host: str, port: int) -> bool:
    """True when something listens on host:port, so a node can't bind there."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the node binds
        try:
            s.bind((host, port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False
