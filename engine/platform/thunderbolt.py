"""Thunderbolt cabling on macOS: which local port faces which remote Mac.

Inputs are the printed output of `system_profiler SPThunderboltDataType -json`,
`networksetup -listallhardwareports` and `ifconfig bridge0` (shapes in the shared macOS
reference, shared/reference/macos.md; recordings in tests/fixtures/macos/). Every parser here is
pure; `thunderbolt_report` never raises, it returns a report that says why it is empty.
Combining the reports of several Macs (`cable_graph`) gives the cable graph: each port's
own domain UUID is what the Mac at the other end lists under `_items`. Checked against real
captures (tests/fixtures/macos/captured/): a connected port prints its negotiated speed
("80 Gb/s"), an empty one its capability ("Up to 120 Gb/s"); a Mac peer's `_name` is its
marketing name and `device_name_key` its model identifier; its `services_title` lists an RDMA
service only while that peer has RDMA on; a Mac behind a dock sits in the dock's `_items`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

# The XDomain service a Mac peer lists only while its RDMA is on (system_profiler has no name
# for it). Seen on real TB5 captures; the protocol id is what stays when the name is missing.
RDMA_SERVICE_NAMES = ("unknown_xd_service",)
RDMA_SERVICE_PROTOCOL = 64087
MAX_DOCK_DEPTH = 3  # Macs behind docks behind docks; real chains are short
NO_HARDWARE = "system_profiler reports no Thunderbolt hardware"
BRIDGE_FIX = ('disable the Thunderbolt Bridge service in System Settings › Network (or run '
              '`networksetup -setnetworkserviceenabled "Thunderbolt Bridge" off`)')


class ProbeParseError(ValueError):
    """A command printed something Shoal can't read; the message says what and where."""


@dataclass(frozen=True)
class ThunderboltPort:
    bus: str                   # "thunderboltusb4_bus_0"
    domain_uuid: str           # this port's own domain
    receptacle: int | None     # the number N of "Thunderbolt N"
    connected: bool
    speed: str | None          # as printed: "80 Gb/s" (negotiated), "Up to 120 Gb/s" (empty)
    remote_uuid: str | None    # domain UUID of the Mac at the other end, if a Mac
    remote_name: str | None    # "Mac Studio"
    interface: str | None = None  # "en2", from networksetup
    remote_model: str | None = None  # "Mac15,14"
    remote_rdma: bool | None = None  # the peer lists its RDMA service here; None: no list
    via: str | None = None     # the dock between this port and the Mac, if any

    @property
    def speed_gbps(self) -> float | None:
        """The negotiated link speed; None for an empty port (it prints only its capability)."""
        if not self.connected or (self.speed or "").lstrip().lower().startswith("up to"):
            return None
        return _gbps(self.speed)

    @property
    def max_gbps(self) -> float | None:
        """What the port can do, from an empty port's "Up to N Gb/s"."""
        return _gbps(self.speed) if (self.speed or "").lstrip().lower().startswith("up to") \
            else None


def _gbps(text: str | None) -> float | None:
    m = re.search(r"([\d.]+)\s*Gb/s", text or "")
    return float(m.group(1)) if m else None


@dataclass(frozen=True)
class ThunderboltReport:
    ports: tuple[ThunderboltPort, ...] = ()
    bridge: str | None = None             # device of the "Thunderbolt Bridge" service
    bridge_members: tuple[str, ...] = ()
    bridge_up: bool | None = None
    bridge_service_enabled: bool | None = None
    unavailable: str | None = None        # why there are no ports, when there are none
    notes: tuple[str, ...] = field(default=())  # parts that were skipped, and why

    @property
    def generation(self) -> int | None:
        """5 when any port links or can link at 80 Gb/s or more; 4 when an empty port says
        "Up to 40 Gb/s" and none is faster; None when the ports don't tell."""
        speeds = [g for p in self.ports for g in (p.speed_gbps, p.max_gbps) if g]
        if any(g >= 80 for g in speeds):
            return 5
        return 4 if any(p.max_gbps for p in self.ports) else None

    def facing(self) -> dict[str, ThunderboltPort]:
        """Remote domain UUID → the local port cabled to it."""
        return {p.remote_uuid: p for p in self.ports if p.remote_uuid}

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["ports"] = [asdict(p) for p in self.ports]
        return d

    @classmethod
    def from_json(cls, d: Any) -> ThunderboltReport:
        """Rebuild a peer's report from JSON; unknown fields are ignored, bad ones explained."""
        try:
            ports = tuple(_port_from_json(p) for p in d.get("ports") or [])
            return cls(ports=ports, bridge=d.get("bridge"),
                       bridge_members=tuple(d.get("bridge_members") or ()),
                       bridge_up=d.get("bridge_up"),
                       bridge_service_enabled=d.get("bridge_service_enabled"),
                       unavailable=d.get("unavailable"), notes=tuple(d.get("notes") or ()))
        except (AttributeError, TypeError) as e:
            return cls(unavailable=f"unreadable Thunderbolt report from peer: {e}")


_PORT_TYPES: dict[str, tuple[type, ...]] = {
    "bus": (str,), "domain_uuid": (str,), "receptacle": (int, type(None)),
    "connected": (bool,), "speed": (str, type(None)), "remote_uuid": (str, type(None)),
    "remote_name": (str, type(None)), "interface": (str, type(None)),
    "remote_model": (str, type(None)), "remote_rdma": (bool, type(None)),
    "via": (str, type(None))}


def _port_from_json(p: Any) -> ThunderboltPort:
    fields = {k: p.get(k) for k in _PORT_TYPES}  # unknown (newer) keys are dropped
    bad = [k for k, v in fields.items() if not isinstance(v, _PORT_TYPES[k])]
    if bad:
        raise TypeError(f"port fields {', '.join(bad)} have the wrong type")
    return ThunderboltPort(**fields)


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def parse_system_profiler(text: str) -> tuple[tuple[ThunderboltPort, ...], tuple[str, ...]]:
    """Ports (without interfaces) and notes on skipped entries. Raises ProbeParseError."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ProbeParseError(f"system_profiler printed something that isn't JSON ({e})") from None
    buses = data.get("SPThunderboltDataType") if isinstance(data, dict) else data
    if not isinstance(buses, list):
        raise ProbeParseError("system_profiler output has no SPThunderboltDataType list")
    ports: list[ThunderboltPort] = []
    notes: list[str] = []
    for i, bus in enumerate(buses):
        if isinstance(bus, dict) and "no_hardware" in bus.values():
            continue  # a Mac (or VM) without Thunderbolt: [{"Thunderbolt": "no_hardware"}]
        name = _str(bus.get("_name")) if isinstance(bus, dict) else None
        uuid = _str(bus.get("domain_uuid_key")) if isinstance(bus, dict) else None
        if not isinstance(bus, dict) or uuid is None:
            notes.append(f"Thunderbolt entry {i} ({name or '?'}) has no domain UUID; skipped")
            continue
        tag = next((v for k, v in sorted(bus.items())
                    if re.fullmatch(r"receptacle_\d+_tag", k) and isinstance(v, dict)), {})
        rid = _str(tag.get("receptacle_id_key"))
        receptacle = int(rid) if rid and rid.isdecimal() else None
        if receptacle is None:
            notes.append(f"{name or uuid}: no usable receptacle number ({rid!r})")
        items = _items(bus)
        remote, via = _find_mac(items)
        status = tag.get("receptacle_status_key")
        ports.append(ThunderboltPort(
            bus=name or f"bus{i}", domain_uuid=uuid, receptacle=receptacle,
            connected=status == "receptacle_connected" or bool(items),
            speed=_str(tag.get("current_speed_key")),
            remote_uuid=remote["domain_uuid_key"] if remote else None,
            remote_name=_str(remote.get("_name") or remote.get("device_name_key"))
            if remote else None,
            remote_model=_str(remote.get("device_name_key")) if remote else None,
            remote_rdma=_offers_rdma(remote) if remote else None, via=via))
    if not ports and not notes and buses:
        notes.append(NO_HARDWARE)
    return tuple(ports), tuple(notes)


def _items(entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    items = entry.get("_items")
    return [x for x in items if isinstance(x, dict)] if isinstance(items, list) else []


def _find_mac(items: list[dict[str, Any]], depth: int = 0
              ) -> tuple[dict[str, Any] | None, str | None]:
    """The Mac on this port and the dock it sits behind (None when cabled directly).
    Displays, drives and docks carry no domain UUID; a Mac does."""
    mac = next((x for x in items if _str(x.get("domain_uuid_key"))), None)
    if mac is not None or depth >= MAX_DOCK_DEPTH:
        return mac, None
    for dock in items:
        found, _ = _find_mac(_items(dock), depth + 1)
        if found is not None:
            return found, _str(dock.get("_name")) or "a dock"
    return None, None


def _offers_rdma(mac: Mapping[str, Any]) -> bool | None:
    services = mac.get("services_title")
    if not isinstance(services, list):
        return None  # older macOS, or a trimmed report: unknown, not "no"
    return any(isinstance(s, dict) and (s.get("_name") in RDMA_SERVICE_NAMES
                                        or s.get("protocol_id_key") == RDMA_SERVICE_PROTOCOL)
               for s in services)


def parse_hardware_ports(text: str) -> dict[str, str]:
    """`networksetup -listallhardwareports` → {"Thunderbolt 1": "en2", "Wi-Fi": "en1", ...}."""
    ports: dict[str, str] = {}
    name: str | None = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("Hardware Port:"):
            name = line.partition(":")[2].strip()
        elif line.startswith("Device:") and name:
            ports[name] = line.partition(":")[2].strip()
            name = None
    if not ports:
        first = next((ln for ln in text.splitlines() if ln.strip()), "")
        raise ProbeParseError(f"networksetup listed no hardware ports ({first.strip()!r})")
    return ports


def interface_kinds(hardware_ports: Mapping[str, str]) -> dict[str, str]:
    """Device → kind: thunderbolt, thunderbolt-bridge, ethernet, wifi, other (+ lo0)."""
    kinds = {"lo0": "loopback"}
    for name, dev in hardware_ports.items():
        if name == "Thunderbolt Bridge":
            kinds[dev] = "thunderbolt-bridge"
        elif re.fullmatch(r"Thunderbolt \d+", name):
            kinds[dev] = "thunderbolt"
        elif name in ("Wi-Fi", "AirPort"):
            kinds[dev] = "wifi"
        elif "Ethernet" in name or "LAN" in name:  # includes "Thunderbolt Ethernet Slot 0"
            kinds[dev] = "ethernet"
        else:
            kinds[dev] = "other"
    return kinds


def parse_bridge(text: str) -> tuple[tuple[str, ...], bool | None]:
    """`ifconfig bridge0` → (member interfaces, interface up?); no bridge → ((), False)."""
    if "does not exist" in text:
        return (), False
    members = tuple(m.group(1) for m in re.finditer(r"^\s*member:\s*(\S+)", text, re.M))
    flags = re.search(r"flags=\w+<([^>]*)>", text)
    return members, ("UP" in flags.group(1).split(",")) if flags else None


def thunderbolt_report(profiler_json: str, hardware_ports: str | None,
                       bridge: str | None = None,
                       bridge_service_enabled: bool | None = None) -> ThunderboltReport:
    """Combine the three outputs into one report; never raises."""
    try:
        ports, notes = parse_system_profiler(profiler_json)
    except ProbeParseError as e:
        return ThunderboltReport(unavailable=f"unavailable: {e}")
    hw: dict[str, str] = {}
    if hardware_ports is not None:
        try:
            hw = parse_hardware_ports(hardware_ports)
        except ProbeParseError as e:
            notes += (f"port → interface mapping unknown: {e}",)
    ports = tuple(_with_interface(p, hw) for p in ports)
    members, up = parse_bridge(bridge) if bridge is not None else ((), None)
    none = "no Thunderbolt hardware on this Mac" if NO_HARDWARE in notes else \
        "no Thunderbolt ports reported by system_profiler"
    return ThunderboltReport(
        ports=ports, bridge=hw.get("Thunderbolt Bridge"), bridge_members=members,
        bridge_up=up, bridge_service_enabled=bridge_service_enabled, notes=notes,
        unavailable=None if ports else none)


def _with_interface(p: ThunderboltPort, hw: Mapping[str, str]) -> ThunderboltPort:
    iface = hw.get(f"Thunderbolt {p.receptacle}") if p.receptacle is not None else None
    return ThunderboltPort(**{**asdict(p), "interface": iface})


def bridge_loop_warning(report: ThunderboltReport, rdma_devices: tuple[str, ...] = ()
                        ) -> str | None:
    """The warning when the Thunderbolt Bridge holds ports cabled to Macs or used for RDMA."""
    if report.bridge_service_enabled is False or report.bridge_up is False:
        return None
    used = {p.interface for p in report.ports if p.interface and p.remote_uuid}
    used |= {d.removeprefix("rdma_") for d in rdma_devices} & {p.interface for p in report.ports
                                                            if p.connected}
    looped = [m for m in report.bridge_members if m in used]
    if not looped:
        return None
    return (f"The Thunderbolt Bridge ({report.bridge or 'bridge0'}) includes "
            f"{', '.join(looped)}, which {'is' if len(looped) == 1 else 'are'} cabled to other "
            "Macs: bridged Thunderbolt ports loop traffic between Macs and keep RDMA (jaccl) "
            f"from using them. To fix it, {BRIDGE_FIX}.")


@dataclass(frozen=True)
class PortEnd:
    node: str
    receptacle: int | None
    interface: str | None
    domain_uuid: str
    sees_rdma: bool | None = None  # this end sees the far Mac's RDMA service on the cable


@dataclass(frozen=True)
class Cable:
    a: PortEnd
    b: PortEnd
    speed: str | None             # negotiated, e.g. "80 Gb/s"
    via: str | None = None        # a dock on the way

    @property
    def speed_gbps(self) -> float | None:
        return _gbps(self.speed)

    def end_on(self, node: str) -> PortEnd:
        return self.a if self.a.node == node else self.b

    def other(self, node: str) -> PortEnd:
        return self.b if self.a.node == node else self.a


def cable_graph(reports: Mapping[str, ThunderboltReport]) -> tuple[Cable, ...]:
    """Cables between the given nodes (node id → report), each once, in a stable order.

    A cable needs only one side to name the other's domain UUID: a peer whose system_profiler
    printed no `_items` for the port still appears, found from the far side.
    """
    index = {p.domain_uuid: (node, p) for node, r in reports.items() for p in r.ports}
    seen: set[frozenset[str]] = set()
    cables = []
    for node, r in sorted(reports.items()):
        for p in r.ports:
            if not p.remote_uuid or p.remote_uuid not in index:
                continue
            rnode, rp = index[p.remote_uuid]
            key = frozenset((p.domain_uuid, rp.domain_uuid))
            if rnode == node or key in seen:
                continue
            seen.add(key)
            speed = next((x.speed for x in (p, rp) if x.speed_gbps is not None), None)
            cables.append(Cable(_end(node, p), _end(rnode, rp), speed, p.via or rp.via))
    return tuple(cables)


def _end(node: str, p: ThunderboltPort) -> PortEnd:
    return PortEnd(node, p.receptacle, p.interface, p.domain_uuid,
                   p.remote_rdma if p.remote_uuid else None)


def cables_between(cables: tuple[Cable, ...], a: str, b: str) -> list[Cable]:
    return [c for c in cables if {c.a.node, c.b.node} == {a, b}]
