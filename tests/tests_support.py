"""Small helpers for tests: bounded waits instead of sleeps, and client load."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def wait_until(cond: Callable[[], object], timeout: float, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(interval)
    raise TimeoutError(f"condition not met within {timeout} s")


class ClientLoad:
    """Client threads that each run `client(*args)` until the `with` block ends; on the
    way out every one of them must have finished (a client left hanging fails the test).
    Subclasses record what each request got in `outcomes`."""

    def __init__(self, clients: list[tuple[Any, ...]]):
        self.outcomes: list[Any] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.client, args=a, daemon=True)
                        for a in clients]

    def client(self, *args: Any) -> None:
        raise NotImplementedError

    def __enter__(self) -> ClientLoad:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(40)
        assert not any(t.is_alive() for t in self.threads), "a client was left hanging"
