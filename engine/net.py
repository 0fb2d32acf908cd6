"""Small facts about network addresses, shared by the node and the app."""

from __future__ import annotations

import ipaddress

DEFAULT_PORT = 8421  # the node's user API, where the app and `shoal connect` look first


def is_loopback(host: str) -> bool:
    """True for an address only this machine can reach (127.0.0.0/8, ::1, "localhost")."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# Below every OS's ephemeral range (Linux 32768-60999, macOS 49152-65535): a port found
# free there can't be handed, before its listener binds it, to an outgoing connection as
# its source port (seen: a group's rank failing to listen while clients were busy).
LISTEN_PORTS = range(20000, 32768)


def free_listen_port(host: str, tries: int = 64) -> int:
    """A port free to listen on at `host`, outside the ephemeral range where one is."""
    import random
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for port in random.sample(LISTEN_PORTS, tries):
        with socket.socket(family) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(family) as s:  # all taken: any port the OS gives
        s.bind((host, 0))
        return int(s.getsockname()[1])
