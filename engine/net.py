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
