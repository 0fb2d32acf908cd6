"""Platform probes: run the macOS commands behind thunderbolt.py and rdma.py, each bounded in
time, and return one frozen PlatformReport. A missing command, a non-zero exit or a timeout
becomes "unavailable: <reason>" in the report, never an exception. On Linux the Thunderbolt
and RDMA parts are empty with the reason, and network interface kinds come from sysfs.

Slow (system_profiler takes a second or more): call from a thread, e.g. asyncio.to_thread.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.platform.rdma import RdmaReport, rdma_report
from engine.platform.thunderbolt import (
    ThunderboltReport,
    bridge_loop_warning,
    interface_kinds,
    parse_hardware_ports,
    thunderbolt_report,
)

log = logging.getLogger(__name__)
COMMAND_TIMEOUT_S = 5.0
PROFILER_TIMEOUT_S = 20.0  # system_profiler walks the Thunderbolt tree; seconds, not minutes
SYSTEM_DIRS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")
NOT_MACOS = "unavailable: Thunderbolt cabling and RDMA are read on macOS only"


@dataclass(frozen=True)
class CommandResult:
    stdout: str | None      # None when the command did not give usable output
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.stdout is not None


Runner = Callable[[Sequence[str], float], CommandResult]


def run_command(argv: Sequence[str], timeout: float = COMMAND_TIMEOUT_S) -> CommandResult:
    """Run one command with a time bound; every failure becomes a reason."""
    exe = argv[0]
    # An app started from Finder may have a short PATH; the system tools live in these.
    path = shutil.which(exe, path=os.pathsep.join([os.environ.get("PATH", ""), *SYSTEM_DIRS]))
    if path is None:
        return CommandResult(None, f"unavailable: `{exe}` is not installed on this machine")
    try:
        p = subprocess.run([path, *argv[1:]], capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL, errors="replace")
    except subprocess.TimeoutExpired:
        return CommandResult(None, f"unavailable: `{' '.join(argv)}` took longer than "
                                   f"{timeout:g} s")
    except OSError as e:
        return CommandResult(None, f"unavailable: `{exe}` could not run ({e})")
    if p.returncode != 0:
        err = (p.stderr or p.stdout or "").strip().splitlines()
        return CommandResult(None, f"unavailable: `{' '.join(argv)}` exited with status "
                                   f"{p.returncode}" + (f": {err[-1][:200]}" if err else ""))
    return CommandResult(p.stdout)


@dataclass(frozen=True)
class PlatformReport:
    system: str                                  # "macos" | "linux" | sys.platform
    thunderbolt: ThunderboltReport
    rdma: RdmaReport
    interfaces: Mapping[str, str] = field(default_factory=dict)  # name → kind
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"system": self.system, "thunderbolt": self.thunderbolt.to_json(),
                "rdma": self.rdma.to_json(), "interfaces": dict(self.interfaces),
                "warnings": list(self.warnings)}

    @classmethod
    def from_json(cls, d: Any) -> PlatformReport:
        """A peer's report from its /shoal/node JSON (anything but an object: a report
        that says none came); never raises."""
        if not isinstance(d, dict):
            why = "unavailable: peer sent no platform report"
            return cls("unknown", ThunderboltReport(unavailable=why), RdmaReport(None, (), why))
        ifs = d.get("interfaces")
        return cls(str(d.get("system", "unknown")),
                   ThunderboltReport.from_json(d.get("thunderbolt") or {}),
                   RdmaReport.from_json(d.get("rdma") or {}),
                   {str(k): str(v) for k, v in ifs.items()} if isinstance(ifs, dict) else {},
                   tuple(str(w) for w in d.get("warnings") or () if isinstance(w, str)))


def probe_platform(*, system: str | None = None, runner: Runner = run_command,
                   net_root: Path = Path("/sys/class/net")) -> PlatformReport:
    """What this machine can tell about its Thunderbolt, RDMA and network interfaces."""
    system = system or sys.platform
    if system == "darwin":
        return _probe_macos(runner)
    why = NOT_MACOS
    return PlatformReport("linux" if system.startswith("linux") else system,
                          ThunderboltReport(unavailable=why), RdmaReport(None, (), why),
                          linux_interface_kinds(net_root) if system.startswith("linux") else {})


def _probe_macos(run: Runner) -> PlatformReport:
    profiler = run(["system_profiler", "SPThunderboltDataType", "-json"], PROFILER_TIMEOUT_S)
    hw = run(["networksetup", "-listallhardwareports"], COMMAND_TIMEOUT_S)
    bridge = run(["ifconfig", "bridge0"], COMMAND_TIMEOUT_S)
    service = run(["networksetup", "-getnetworkserviceenabled", "Thunderbolt Bridge"],
                  COMMAND_TIMEOUT_S)
    status = run(["rdma_ctl", "status"], COMMAND_TIMEOUT_S)
    devices = run(["ibv_devices"], COMMAND_TIMEOUT_S) if status.ok else CommandResult(None)

    enabled = None
    if service.stdout is not None and service.stdout.strip().lower() in ("enabled", "disabled"):
        enabled = service.stdout.strip().lower() == "enabled"
    # A missing bridge0 makes ifconfig exit 1; that simply means no bridge.
    bridge_text = bridge.stdout if bridge.ok else (
        "bridge0 does not exist" if "does not exist" in (bridge.reason or "") else None)
    if profiler.stdout is not None:
        tb = thunderbolt_report(profiler.stdout, hw.stdout, bridge_text, enabled)
    else:
        tb = ThunderboltReport(unavailable=profiler.reason)
    rdma = rdma_report(status.stdout, devices.stdout, status_reason=status.reason,
                       devices_reason=devices.reason, thunderbolt=tb.generation)
    kinds: dict[str, str] = {"lo0": "loopback"}
    if hw.stdout is not None:
        try:
            kinds = interface_kinds(parse_hardware_ports(hw.stdout))
        except ValueError as e:
            log.warning("network interface kinds unknown: %s", e)
    warning = bridge_loop_warning(tb, rdma.devices)
    return PlatformReport("macos", tb, rdma, kinds, (warning,) if warning else ())


RECORDED = {"system_profiler": "system_profiler_SPThunderboltDataType.json",
            "networksetup -listallhardwareports": "networksetup_listallhardwareports.txt",
            "ifconfig": "ifconfig_bridge0.txt",
            "networksetup -getnetworkserviceenabled": "networksetup_getnetworkserviceenabled.txt",
            "rdma_ctl": "rdma_ctl_status.txt", "ibv_devices": "ibv_devices.txt"}


def recorded_runner(folder: Path) -> Runner:
    """A Runner that answers the macOS probes' commands from the output a Mac printed,
    saved in `folder` (SHOAL_PLATFORM_RECORDING: a Linux test node that reports a Mac's
    Thunderbolt cabling and RDMA, as tests/fixtures/macos/ holds them)."""
    def run(argv: Sequence[str], timeout: float) -> CommandResult:
        for prefix, name in RECORDED.items():
            if " ".join(argv).startswith(prefix):
                try:
                    return CommandResult((folder / name).read_text())
                except OSError as e:
                    return CommandResult(None, f"not recorded: {e}")
        return CommandResult(None, f"not recorded: {' '.join(argv)}")
    return run


def linux_interface_kinds(root: Path = Path("/sys/class/net")) -> dict[str, str]:
    """Interface → kind from sysfs: loopback, wifi, thunderbolt, bridge, ethernet, other."""
    kinds: dict[str, str] = {}
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return kinds
    for d in entries:
        kinds[d.name] = _linux_kind(d)
    return kinds


def _linux_kind(d: Path) -> str:
    try:
        arp_type = (d / "type").read_text().strip()
    except OSError:
        arp_type = ""
    if d.name == "lo" or arp_type == "772":  # ARPHRD_LOOPBACK
        return "loopback"
    if (d / "wireless").exists() or (d / "phy80211").exists():
        return "wifi"
    if (d / "bridge").exists():
        return "bridge"
    try:
        driver = (d / "device" / "driver").resolve().name
    except OSError:
        driver = ""
    if driver in ("thunderbolt-net", "thunderbolt_net"):
        return "thunderbolt"
    return "ethernet" if arp_type == "1" else "other"  # ARPHRD_ETHER covers veth too
