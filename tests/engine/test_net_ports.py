"""Ports a node or a group's rank will listen on are found outside the ephemeral range, so
an outgoing connection can't take one between the check and the bind."""

from __future__ import annotations

import socket

from engine.net import LISTEN_PORTS, free_listen_port


def test_a_listen_port_is_free_and_below_the_ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except OSError:  # macOS: its ephemeral range starts at 49152
        low = 49152
    ports = {free_listen_port("127.0.0.1") for _ in range(20)}
    assert all(p in LISTEN_PORTS and p < low for p in ports)
    for p in ports:  # each is free to listen on
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_taken_port_is_never_given():
    held = []
    try:
        for _ in range(50):
            s = socket.socket()
            s.bind(("127.0.0.1", free_listen_port("127.0.0.1")))
            held.append(s)
        assert len({s.getsockname()[1] for s in held}) == 50
    finally:
        for s in held:
            s.close()
