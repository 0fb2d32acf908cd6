"""RDMA over Thunderbolt (macOS 26.2+): its state, and the jaccl device matrix.

`rdma_ctl status` says enabled/disabled; `ibv_devices` lists one `rdma_enX` per Thunderbolt
interface `enX` that can do RDMA. With the cable graph (thunderbolt.py) this gives, for an
ordered list of ranks, the N×N matrix MLX's jaccl backend reads from MLX_IBV_DEVICES — or
the exact pair that can't use RDMA, and why. A cable carries RDMA only when it is a Thunderbolt
5 link (80 Gb/s or more), each end has its `rdma_enX` device, and each Mac sees the other's
RDMA service on it (system_profiler's `services_title`). Pure functions; no I/O here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.platform.thunderbolt import Cable, ProbeParseError, cables_between

ENABLE_HELP = ("RDMA over Thunderbolt is disabled on this Mac. To enable it (once per Mac): shut "
               "down, start up into Recovery (hold the power button, then Options), open "
               "Utilities › Terminal, run `rdma_ctl enable`, and restart. It needs macOS 26.2 "
               "or later and Thunderbolt 5 cables; every Mac should run the same macOS version.")
TB4_FINAL = ("This Mac's Thunderbolt ports are Thunderbolt 4 (up to 40 Gb/s), which has no RDMA: "
             "ibv_devices lists no devices on this hardware, and no cable, setting or restart "
             "changes that. RDMA needs a Mac with Thunderbolt 5; this Mac joins over TCP "
             "(Thunderbolt IP, Ethernet or Wi-Fi).")
MIN_RDMA_GBPS = 80.0  # a Thunderbolt 5 link; 40 Gb/s and below is Thunderbolt 4 or a TB3 dock
NO_RDMA_PORT_HINT = ("on Mac Studio the Thunderbolt port next to the Ethernet port has no RDMA, "
                     "and Thunderbolt 4 links have none: move the cable to another port")
ENABLE_STEP = "run `rdma_ctl enable` in Recovery and restart"
LINK_TYPES = ("thunderbolt-rdma", "thunderbolt-ip", "ethernet", "wifi", "loopback")


@dataclass(frozen=True)
class RdmaReport:
    enabled: bool | None
    devices: tuple[str, ...] = ()
    unavailable: str | None = None   # why the state is unknown
    thunderbolt: int | None = None   # Thunderbolt generation of this Mac (4, 5), if known

    @property
    def explanation(self) -> str | None:
        """What a user should read about this Mac's RDMA, or None when it is ready."""
        if self.enabled is None:
            return self.unavailable or "unavailable: RDMA state unknown"
        if self.thunderbolt == 4 and not self.devices:
            return TB4_FINAL  # enabled or not, this hardware never gets a device
        if self.enabled is False:
            return ENABLE_HELP
        if not self.devices:
            return ("RDMA is enabled but ibv_devices lists no RDMA devices: connect a "
                    "Thunderbolt 5 cable to another Mac, or restart after `rdma_ctl enable`. "
                    "(A Mac with only Thunderbolt 4 never lists any.)")
        return None

    def to_json(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "devices": list(self.devices),
                "unavailable": self.unavailable, "thunderbolt": self.thunderbolt,
                "explanation": self.explanation}

    @classmethod
    def from_json(cls, d: Any) -> RdmaReport:
        try:
            enabled = d.get("enabled")
            devices = tuple(str(x) for x in d.get("devices") or ())
            why, gen = d.get("unavailable"), d.get("thunderbolt")
            return cls(enabled if isinstance(enabled, bool) else None, devices,
                       why if isinstance(why, str) else None,
                       gen if isinstance(gen, int) and not isinstance(gen, bool) else None)
        except (AttributeError, TypeError) as e:
            return cls(None, (), f"unreadable RDMA report from peer: {e}")


def parse_rdma_ctl(text: str) -> bool:
    """`rdma_ctl status` → True (enabled) / False (disabled). Raises ProbeParseError."""
    words = re.findall(r"[a-z]+", text.lower())
    state = {"enabled", "disabled"} & set(words)
    if len(state) == 1 and "not" not in words:  # "not enabled" is no answer we know
        return state == {"enabled"}
    raise ProbeParseError(f"rdma_ctl status printed {text.strip()[:120]!r}, not "
                          "enabled/disabled")


def parse_ibv_devices(text: str) -> tuple[str, ...]:
    """`ibv_devices` → ("rdma_en2", ...): the first word of each row under the header."""
    names = []
    for line in text.splitlines():
        words = line.split()  # header rows, dashes and "No IB devices found" don't match
        if 1 <= len(words) <= 2 and re.fullmatch(r"[A-Za-z][\w.-]*", words[0]) \
                and words[0] != "device" \
                and (len(words) == 1 or re.fullmatch(r"(0x)?[0-9a-fA-F:]+", words[1])):
            names.append(words[0])
    return tuple(names)


def rdma_report(status: str | None, devices: str | None, *, status_reason: str | None = None,
                devices_reason: str | None = None, thunderbolt: int | None = None
                ) -> RdmaReport:
    """Outputs of `rdma_ctl status` and `ibv_devices` (None where the command failed, with
    its reason) and the Mac's Thunderbolt generation → a report; never raises."""
    if status is None:
        return RdmaReport(None, (), status_reason or "unavailable: rdma_ctl did not run",
                          thunderbolt)
    try:
        enabled = parse_rdma_ctl(status)
    except ProbeParseError as e:
        return RdmaReport(None, (), f"unavailable: {e}", thunderbolt)
    if not enabled:
        return RdmaReport(False, thunderbolt=thunderbolt)
    if devices is None:
        return RdmaReport(True, (), devices_reason or "unavailable: ibv_devices did not run",
                          thunderbolt)
    return RdmaReport(True, parse_ibv_devices(devices), thunderbolt=thunderbolt)


@dataclass(frozen=True)
class JacclMatrix:
    backend: str                                          # "jaccl" | "jaccl-ring"
    ranks: tuple[str, ...]
    matrix: tuple[tuple[str | None, ...], ...] | None     # None when a pair can't use RDMA
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.matrix is not None

    def to_json(self) -> list[list[str | None]]:
        """The MLX_IBV_DEVICES file content."""
        if self.matrix is None:
            raise ValueError("no device matrix: " + "; ".join(self.problems))
        return [list(row) for row in self.matrix]


def needed_pairs(n: int, ring: bool) -> list[tuple[int, int]]:
    """Rank pairs that need a cable: all of them for jaccl, ring neighbours for jaccl-ring."""
    if ring:
        pairs = {(min(i, (i + 1) % n), max(i, (i + 1) % n)) for i in range(n)}
        return sorted((i, j) for i, j in pairs if i != j)
    return [(i, j) for i in range(n) for j in range(i + 1, n)]


def device_matrix(ranks: Sequence[str], cables: tuple[Cable, ...],
                  rdma: Mapping[str, RdmaReport], *, ring: bool = False,
                  names: Mapping[str, str] | None = None) -> JacclMatrix:
    """The jaccl (or jaccl-ring) device matrix for `ranks` (node ids, rank 0 first)."""
    backend = "jaccl-ring" if ring else "jaccl"

    def label(i: int) -> str:
        return f"{(names or {}).get(ranks[i], ranks[i])} (rank {i})"

    n, problems = len(ranks), []
    if n < 2:
        problems.append(f"{backend} needs at least two nodes")
    if len(set(ranks)) != n:
        problems.append("a node appears twice in the rank list")
    bad = set()
    for i, node in enumerate(ranks):
        why = rdma[node].explanation if node in rdma else "no RDMA report from this node"
        if why:
            bad.add(node)
            problems.append(f"{label(i)}: {why}")
    cells: list[list[str | None]] = [[None] * n for _ in range(n)]
    for i, j in needed_pairs(n, ring):
        a, b = ranks[i], ranks[j]
        if a in bad or b in bad or a == b:
            continue
        found = cables_between(cables, a, b)
        if not found:
            problems.append(f"no Thunderbolt cable between {label(i)} and {label(j)}"
                            + ("" if ring else f" ({backend} needs a cable between every pair"
                               "; jaccl-ring needs only neighbours)"))
            continue
        reasons = [cable_problem(c, a, b, rdma, label(i), label(j)) for c in found]
        pick = next((c for c, w in zip(found, reasons) if w is None), None)
        if pick is None:  # every cable fails: the first one's reason says enough
            problems.append(reasons[0] or "")
            continue
        cells[i][j] = f"rdma_{pick.end_on(a).interface}"
        cells[j][i] = f"rdma_{pick.end_on(b).interface}"
    matrix = None if problems else tuple(tuple(r) for r in cells)
    return JacclMatrix(backend, tuple(ranks), matrix, tuple(problems))


def cable_problem(c: Cable, a: str, b: str, rdma: Mapping[str, RdmaReport],
                  la: str | None = None, lb: str | None = None) -> str | None:
    """Why this cable between nodes a and b can't carry RDMA, or None when it can.
    la / lb: how to name the nodes in the message."""
    la, lb = la or a, lb or b
    speed = c.speed_gbps
    if speed is not None and speed < MIN_RDMA_GBPS:
        via = f" through {c.via}" if c.via else ""
        return (f"the cable between {la} and {lb}{via} links at {c.speed}, a Thunderbolt 4 "
                "link, which has no RDMA: cable the two Macs directly with a Thunderbolt 5 "
                "cable (80 Gb/s)")
    for node, label, other in ((a, la, lb), (b, lb, la)):
        r = rdma.get(node)
        if r is None or r.explanation:
            return f"{label}: {r.explanation if r else 'no RDMA report from this node'}"
        end = c.end_on(node)
        if end.interface is None:
            return (f"{label}: Thunderbolt port {end.receptacle} (cabled to {other}) has no "
                    "network interface in `networksetup -listallhardwareports`")
        if f"rdma_{end.interface}" not in r.devices:
            listed = ", ".join(r.devices) or "none"
            sp = f", {c.speed}" if c.speed else ""
            return (f"{label}: the cable to {other} is on Thunderbolt port {end.receptacle} "
                    f"({end.interface}{sp}), which has no RDMA device rdma_{end.interface} "
                    f"(ibv_devices lists {listed}); {NO_RDMA_PORT_HINT}")
    for node, label, other in ((a, la, lb), (b, lb, la)):
        if c.end_on(node).sees_rdma is False:
            return (f"{label} sees no RDMA service from {other} on this cable (its "
                    f"Thunderbolt port {c.end_on(node).receptacle}): RDMA is not on at "
                    f"{other}'s end; {ENABLE_STEP} on {other}, or move the cable to a port "
                    "with RDMA")
    return None


def link_type(kind: str, *, rdma: bool = False) -> str | None:
    """Interface kind (see thunderbolt.interface_kinds / probes) → link type, or None."""
    if kind == "thunderbolt":
        return "thunderbolt-rdma" if rdma else "thunderbolt-ip"
    return {"thunderbolt-bridge": "thunderbolt-ip", "ethernet": "ethernet", "bridge": "ethernet",
            "wifi": "wifi", "loopback": "loopback"}.get(kind)


def pair_link_types(a: str, b: str, cables: tuple[Cable, ...],
                    rdma: Mapping[str, RdmaReport]) -> tuple[str, ...]:
    """Thunderbolt link types between two nodes from the cable graph (one per cable)."""
    if a == b:
        return ("loopback",)
    return tuple("thunderbolt-rdma" if cable_problem(c, a, b, rdma) is None
                 else "thunderbolt-ip" for c in cables_between(cables, a, b))
