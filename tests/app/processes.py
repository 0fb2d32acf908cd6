"""Whether a process is still there, for tests that check quitting leaves nothing behind."""

from __future__ import annotations

import os
from pathlib import Path


def running(pid: int | None) -> bool:
    """True while the process exists and is not a zombie (an exited process that nobody has
    reaped yet, e.g. under a container init that doesn't reap, has stopped all the same)."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (macOS): it exists
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
