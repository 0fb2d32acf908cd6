"""A download killed midway (SIGKILL, as a crash or a closed laptop lid) or cancelled
resumes without fetching its finished bytes again: the server's byte counters prove it."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from hub_models import BIG

from engine.errors import Cancelled
from engine.hub.download import pull, repo_dir
from tests_support import wait_until

ROOT = Path(__file__).resolve().parents[3]


def _partial(hf_env: Path, hub) -> Path:
    f = hub.repos[BIG].files["model.safetensors"]
    return repo_dir(hf_env, BIG) / "blobs" / f"{f.sha256}.incomplete"


def test_a_killed_download_resumes_where_it_stopped(hub, hf_env: Path) -> None:
    f = hub.repos[BIG].files["model.safetensors"]
    hub.rate_bps = 2e6  # slow enough to kill it midway
    proc = subprocess.Popen(
        [sys.executable, "-c", f"from engine.hub.download import pull; pull({BIG!r})"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        partial = _partial(hf_env, hub)
        wait_until(lambda: partial.exists() and partial.stat().st_size > 500_000, 30)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    kept = partial.stat().st_size
    assert 0 < kept < f.size
    hub.rate_bps = None
    hub.reset_counters()
    snap = pull(BIG)
    gets = [r for r in hub.file_requests("model.safetensors") if r["method"] == "GET"]
    assert [(r["start"], r["status"]) for r in gets] == [(kept, 206)]
    assert hub.served(BIG, "model.safetensors") == f.size - kept  # not one byte twice
    assert hashlib.sha256((snap / "model.safetensors").read_bytes()).hexdigest() == f.sha256
    assert not partial.exists()


def test_cancel_stops_promptly_and_keeps_the_finished_bytes(hub, hf_env: Path) -> None:
    hub.rate_bps = 2e6
    cancel = threading.Event()
    box: dict = {}

    def run() -> None:
        try:
            pull(BIG, cancel_event=cancel)
        except BaseException as e:
            box["error"] = e
    t = threading.Thread(target=run)
    t.start()
    partial = _partial(hf_env, hub)
    wait_until(lambda: partial.exists() and partial.stat().st_size > 300_000, 30)
    t0 = time.monotonic()
    cancel.set()
    t.join(5)
    assert not t.is_alive() and time.monotonic() - t0 < 1.0
    assert isinstance(box.get("error"), Cancelled)
    kept = partial.stat().st_size
    hub.rate_bps = None
    hub.reset_counters()
    pull(BIG)
    starts = [r["start"] for r in hub.file_requests("model.safetensors")
              if r["method"] == "GET"]
    assert starts == [kept]
