"""mDNS discovery (zeroconf, service _shoal._tcp): announce this node and add every node
heard on the network as a peer. Liveness is not mDNS's job (a killed node stays listed for
many minutes): the peers' heartbeat decides who is gone."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)
SERVICE = "_shoal._tcp.local."
PROTO = 1  # bump when the TXT record's meaning changes


def parse_record(addresses: list[str], port: Any, txt: dict[Any, Any]) -> tuple[str, dict]:
    """(peer URL, TXT fields) from a resolved record, or ValueError saying what's wrong.
    Unknown TXT fields (a newer Shoal) are kept and ignored."""
    fields = {(k.decode() if isinstance(k, bytes) else str(k)):
              (v.decode(errors="replace") if isinstance(v, bytes) else v)
              for k, v in (txt or {}).items()}
    if not addresses:
        raise ValueError("the record has no IPv4 address")
    if not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"the record's port {port!r} is not a port")
    if not fields.get("id"):
        raise ValueError("the record has no node id")
    try:
        proto = int(fields.get("proto") or 0)
    except ValueError:
        raise ValueError(f"the record's protocol {fields.get('proto')!r} is not a number") \
            from None
    if proto > PROTO:
        log.info("node %s speaks a newer discovery protocol (%d); using the fields we know",
                 fields.get("id"), proto)
    return f"http://{addresses[0]}:{port}", fields


class Discovery:
    """Announce and browse. `interfaces` pins zeroconf to given addresses (tests use their
    own network namespaces; None means every interface of the machine)."""

    def __init__(self, node_id: str, name: str, host: str, port: int, version: str,
                 on_found: Callable[[str, dict], None], interfaces: list[str] | None = None):
        self.node_id, self.name, self.host, self.port = node_id, name, host, port
        self.version = version
        self.on_found = on_found
        self.interfaces = interfaces
        self._zc: Any = None
        self._info: Any = None

    def start(self) -> None:
        from zeroconf import InterfaceChoice, IPVersion, ServiceBrowser, ServiceInfo, Zeroconf

        self._zc = Zeroconf(interfaces=self.interfaces or InterfaceChoice.All,
                            ip_version=IPVersion.V4Only)
        self._info = ServiceInfo(
            SERVICE, f"{self.name}-{self.node_id}.{SERVICE}", port=self.port,
            addresses=[socket.inet_aton(self.host)],
            properties={"id": self.node_id, "name": self.name, "ver": self.version,
                        "proto": str(PROTO)})
        self._zc.register_service(self._info)
        ServiceBrowser(self._zc, SERVICE, handlers=[self._changed])
        log.info("mDNS: announcing %s on %s:%d", SERVICE, self.host, self.port)

    def _changed(self, zeroconf: Any, service_type: str, name: str, state_change: Any) -> None:
        from zeroconf import ServiceStateChange
        if state_change not in (ServiceStateChange.Added, ServiceStateChange.Updated):
            return
        try:
            info = zeroconf.get_service_info(service_type, name, timeout=2000)
            if info is None:
                raise ValueError("no answer to the resolve request")
            url, fields = parse_record(info.parsed_addresses(), info.port, info.properties)
        except Exception as e:  # a malformed record must never take the node down
            log.warning("mDNS: ignoring %s: %s", name, e)
            return
        if fields["id"] != self.node_id:
            self.on_found(url, fields)

    def close(self) -> None:
        if self._zc is not None:
            try:
                self._zc.unregister_service(self._info)
            finally:
                self._zc.close()
