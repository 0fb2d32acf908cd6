"""The doorbell: one-byte op codes between ring neighbours, so no rank ever waits inside MLX.

A rank waiting in an MLX recv or collective busy-spins a core. So before rank i sends a
tensor to rank i+1 over MLX it writes one op byte on a plain TCP connection; the receiver
sleeps in recv() on that socket (no CPU) and enters the MLX recv only once the byte arrives,
i.e. when the tensor is about to. Only op bytes travel here; tensors go over MLX.

Each rank listens on its `bells[rank]` address, connects to its successor and accepts its
predecessor. An EOF on either connection means that neighbour died: reported at once.
"""

from __future__ import annotations

import logging
import queue
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable

from engine.cluster.dist_config import DistConfig
from engine.errors import PeerUnreachable

log = logging.getLogger(__name__)

REQUEST, STEP, TOKEN, END, QUIT, LOADED = b"R", b"S", b"T", b"E", b"Q", b"L"
BATCH = b"B"  # a batched step's plan (engine/runtime/group/batch.py)
HELLO = b"SHOALBELL1"
_HELLO_LEN = len(HELLO) + 4 + 16


DEAD_PATH_S = 10  # a neighbour whose TCP stack doesn't answer this long is gone


def watch_path(s: socket.socket) -> None:
    """Have the kernel notice a dead path to the neighbour within about DEAD_PATH_S, idle
    or not: keepalive probes while nothing is in flight, and a bound on unacknowledged
    data while a byte is. Either ends the reader's recv with an error, and the group
    fails with the reason. Without it a cable cut between two ranks that both still
    reach the owner went unnoticed while idle, and for the group's whole watchdog
    timeout (120 s) while busy."""
    idle = getattr(socket, "TCP_KEEPIDLE", None) or getattr(socket, "TCP_KEEPALIVE", None)
    opts = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1), (socket.IPPROTO_TCP, idle, 4),
            (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), 2),
            (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), 3)]
    if hasattr(socket, "TCP_USER_TIMEOUT"):  # Linux: milliseconds
        opts.append((socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, DEAD_PATH_S * 1000))
    elif sys.platform == "darwin":  # TCP_RXT_CONNDROPTIME (netinet/tcp.h): seconds
        opts.append((socket.IPPROTO_TCP, 0x80, DEAD_PATH_S))
    for level, opt, value in opts:
        if opt is None:
            continue
        try:
            s.setsockopt(level, opt, value)
        except OSError as e:  # an OS without it: the group's watchdog is still the bound
            log.warning("doorbell: socket option %s not set (%s)", opt, e)


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


class Doorbell:
    """`ring(op)` to the successor, `wait()` for the predecessor's next op.

    `on_lost(peer, why)` runs (on a reader thread) when a neighbour's connection ends
    unexpectedly; `on_quit(peer)` when a neighbour says the group is shutting down. After
    `quit()` both are expected and `closed` is set instead."""

    def __init__(self, cfg: DistConfig, on_lost: Callable[[int, str], None],
                 on_quit: Callable[[int], None]):
        self.cfg = cfg
        self._on_lost = on_lost
        self._on_quit = on_quit
        self._ops: queue.Queue[bytes] = queue.Queue()
        self._succ: socket.socket | None = None
        self._pred: socket.socket | None = None
        self._closing = False
        self.closed = threading.Event()

    # -- connecting ---------------------------------------------------------------------
    def open(self) -> None:
        """Listen, connect to the successor, accept the predecessor; bounded by timeout_s.
        Raises PeerUnreachable naming the neighbour that didn't come."""
        cfg = self.cfg
        deadline = time.monotonic() + cfg.timeout_s
        host, port = _split(cfg.bells[cfg.rank])
        listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((host, port))
        except OSError as e:
            raise PeerUnreachable(f"Rank {cfg.rank} can't listen on {cfg.bells[cfg.rank]} "
                                  f"({e}); is another instance using that port?") from e
        listener.listen(8)
        accepted: list[socket.socket] = []
        t = threading.Thread(target=self._accept, args=(listener, deadline, accepted),
                             daemon=True)
        t.start()
        try:
            self._succ = self._connect(deadline)
            t.join(max(0.0, deadline - time.monotonic()) + 1)
        finally:
            listener.close()
        if not accepted:
            p = cfg.predecessor
            raise PeerUnreachable(f"Rank {cfg.rank}: {cfg.where(p)} never rang its doorbell "
                                  f"at {cfg.bells[cfg.rank]} within {cfg.timeout_s:.0f} s.")
        self._pred = accepted[0]
        for s in (self._succ, self._pred):
            s.settimeout(None)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            watch_path(s)
        threading.Thread(target=self._read_pred, name="bell-pred", daemon=True).start()
        threading.Thread(target=self._watch_succ, name="bell-succ", daemon=True).start()

    def _hello(self) -> bytes:
        return HELLO + struct.pack("<HH", self.cfg.rank, self.cfg.world) + self.cfg.group_id

    def _connect(self, deadline: float) -> socket.socket:
        cfg, peer = self.cfg, self.cfg.successor
        why = "no answer"
        while time.monotonic() < deadline:
            s = socket.socket(socket.AF_INET6 if ":" in _split(cfg.bells[peer])[0]
                              else socket.AF_INET)
            s.settimeout(2.0)
            try:
                s.connect(_split(cfg.bells[peer]))
                if s.getsockname() == s.getpeername():  # loopback, nobody listening yet:
                    raise ConnectionRefusedError("not listening yet")  # TCP met itself
                s.sendall(self._hello())
                # the answer may come late (a busy peer) but must be waited for: the peer
                # counts this connection as soon as it has read the hello
                s.settimeout(max(0.1, deadline - time.monotonic()))
                answer = s.recv(1)
                if answer == b"K":
                    return s
                why = "it belongs to another group" if answer == b"X" else \
                    "it closed the connection without answering"
            except OSError as e:
                why = str(e)
            s.close()
            time.sleep(0.1)
        raise PeerUnreachable(f"Rank {cfg.rank} couldn't reach {cfg.where(peer)} at its "
                              f"doorbell {cfg.bells[peer]} within {cfg.timeout_s:.0f} s "
                              f"({why}).")

    def _accept(self, listener: socket.socket, deadline: float,
                out: list[socket.socket]) -> None:
        want = HELLO + struct.pack("<HH", self.cfg.predecessor, self.cfg.world) \
            + self.cfg.group_id
        while (left := deadline - time.monotonic()) > 0:
            listener.settimeout(left)
            try:
                s, _ = listener.accept()
            except OSError:
                return
            s.settimeout(2.0)
            try:
                got = b""
                while len(got) < _HELLO_LEN and (chunk := s.recv(_HELLO_LEN - len(got))):
                    got += chunk
                if got == want:
                    s.sendall(b"K")
                    out.append(s)
                    return
                s.sendall(b"X")  # someone else's rank, or another group on our port
            except OSError:
                pass
            s.close()

    # -- running ------------------------------------------------------------------------
    def ring(self, op: bytes) -> None:
        """Tell the successor what comes next."""
        assert self._succ is not None
        try:
            self._succ.sendall(op)
        except OSError as e:
            if not self._closing:
                self._on_lost(self.cfg.successor, f"its doorbell failed ({e})")

    def wait(self) -> bytes:
        """The predecessor's next op; sleeps without using the CPU."""
        return self._ops.get()

    def quit(self) -> None:
        """Tell both neighbours the group is closing; they pass it on."""
        self._closing = True
        for s in (self._succ, self._pred):
            if s is not None:
                try:
                    s.sendall(QUIT)
                except OSError:
                    pass

    def _read_pred(self) -> None:
        assert self._pred is not None
        while True:
            try:
                data = self._pred.recv(256)
            except OSError as e:
                return self._ended(self.cfg.predecessor, e)
            if not data:
                return self._ended(self.cfg.predecessor)
            for i in range(len(data)):
                op = data[i:i + 1]
                if op == QUIT:
                    return self._quit_from(self.cfg.predecessor)
                self._ops.put(op)

    def _watch_succ(self) -> None:
        # The successor only ever writes QUIT back; anything else is ignored.
        assert self._succ is not None
        while True:
            try:
                data = self._succ.recv(256)
            except OSError as e:
                return self._ended(self.cfg.successor, e)
            if not data:
                return self._ended(self.cfg.successor)
            if QUIT in data:
                return self._quit_from(self.cfg.successor)

    def _ended(self, peer: int, error: OSError | None = None) -> None:
        if self._closing:
            self.closed.set()
        elif isinstance(error, TimeoutError):
            self._on_lost(peer, f"the connection to it went silent for {DEAD_PATH_S} s "
                          "(a cable or network problem between the two machines)")
        else:
            self._on_lost(peer, "its connection closed (the process exited or was killed)"
                          if error is None else f"its connection failed ({error})")

    def _quit_from(self, peer: int) -> None:
        if self._closing:
            self.closed.set()
        else:
            self._on_quit(peer)
