"""probe_platform on macOS through a runner that replays recorded command output
(tests/fixtures/macos/), bounded real commands, and the Linux path on a recorded sysfs layout."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from engine.node.topology import cluster_cables
from engine.platform.probes import (
    CommandResult,
    PlatformReport,
    linux_interface_kinds,
    probe_platform,
    run_command,
)
from engine.platform.rdma import TB4_FINAL, device_matrix
from engine.platform.thunderbolt import cable_graph

MAC = Path(__file__).resolve().parents[2] / "fixtures" / "macos"
FILES = {("system_profiler", "SPThunderboltDataType", "-json"):
         "system_profiler_SPThunderboltDataType.json",
         ("networksetup", "-listallhardwareports"): "networksetup_listallhardwareports.txt",
         ("ifconfig", "bridge0"): "ifconfig_bridge0.txt",
         ("networksetup", "-getnetworkserviceenabled", "Thunderbolt Bridge"):
         "networksetup_getnetworkserviceenabled.txt",
         ("rdma_ctl", "status"): "rdma_ctl_status.txt",
         ("ibv_devices",): "ibv_devices.txt"}


def replay(node_dir: Path, broken: dict[tuple[str, ...], CommandResult] | None = None):
    """A runner that answers each command from a recording (or a given failure)."""
    calls: list[tuple[tuple[str, ...], float]] = []

    def run(argv: Sequence[str], timeout: float) -> CommandResult:
        calls.append((tuple(argv), timeout))
        if broken and tuple(argv) in broken:
            return broken[tuple(argv)]
        return CommandResult((node_dir / FILES[tuple(argv)]).read_text())
    run.calls = calls  # type: ignore[attr-defined]
    return run


def test_macos_report_from_recordings():
    report = probe_platform(system="darwin", runner=replay(MAC / "chain4/studio-b"))
    assert report.system == "macos"
    assert [p.interface for p in report.thunderbolt.ports if p.remote_uuid] == ["en2", "en3"]
    assert report.rdma.enabled and "rdma_en2" in report.rdma.devices
    assert report.interfaces["en0"] == "ethernet" and report.interfaces["en1"] == "wifi"
    assert report.interfaces["en2"] == "thunderbolt"
    (warning,) = report.warnings
    assert "Thunderbolt Bridge" in warning and "en2, en3" in warning


def test_every_command_is_time_bounded():
    run = replay(MAC / "mesh3/studio-a")
    probe_platform(system="darwin", runner=run)
    assert {argv for argv, _ in run.calls} == set(FILES)
    assert all(0 < t <= 30 for _, t in run.calls)


def test_reports_from_three_nodes_make_the_jaccl_matrix_after_a_json_trip():
    # What the node does with its peers: each /shoal/node carries its report as JSON.
    nodes = ["studio-a", "studio-b", "studio-c"]
    reports = {n: PlatformReport.from_json(json.loads(json.dumps(
        probe_platform(system="darwin", runner=replay(MAC / "mesh3" / n)).to_json())))
        for n in nodes}
    cables = cable_graph({n: r.thunderbolt for n, r in reports.items()})
    m = device_matrix(nodes, cables, {n: r.rdma for n, r in reports.items()})
    assert m.to_json()[0] == [None, "rdma_en2", "rdma_en3"]
    assert all(r.warnings == () for r in reports.values())


def test_a_thunderbolt_4_mac_learns_rdma_is_final_there():
    # rdma_ctl and ibv_devices as captured on a TB4 Mac; its ports print "Up to 40 Gb/s".
    report = probe_platform(system="darwin", runner=replay(MAC / "tb4/macbook-air"))
    assert report.thunderbolt.generation == 4
    assert report.rdma.enabled is True and report.rdma.devices == ()
    assert report.rdma.explanation == TB4_FINAL
    peer = PlatformReport.from_json(json.loads(json.dumps(report.to_json())))
    assert peer.rdma.explanation == TB4_FINAL  # what a peer and the GUI read


def test_per_link_rdma_survives_the_json_trip():
    nodes = ["studio", "macbook"]
    reports = {n: PlatformReport.from_json(json.loads(json.dumps(
        probe_platform(system="darwin", runner=replay(MAC / "dock" / n)).to_json())))
        for n in nodes}
    cables = cable_graph({n: r.thunderbolt for n, r in reports.items()})
    assert {c.via for c in cables} == {None, "ThunderBay Flex 8"}
    m = device_matrix(nodes, cables, {n: r.rdma for n, r in reports.items()})
    assert m.to_json() == [[None, "rdma_en3"], ["rdma_en2", None]]


def test_the_topology_lists_each_cable_with_its_rdma_state():
    # What /shoal/topology adds: per cable, from every node's platform report.
    platforms = {n: PlatformReport.from_json(json.loads(json.dumps(probe_platform(
        system="darwin", runner=replay(MAC / "dock" / n)).to_json())))
        for n in ("studio", "macbook")}
    cables = sorted(cluster_cables({**platforms, "linux-box": None}),
                    key=lambda c: c.a_port)
    assert [(c.a, c.a_port, c.b_port, c.speed, c.rdma) for c in cables] == [
        ("macbook", 2, 2, "80 Gb/s", True), ("macbook", 3, 5, "40 Gb/s", False)]
    assert "Thunderbolt 4 link" in cables[1].why
    assert cluster_cables({}) == []


def test_missing_or_failing_commands_become_reasons():
    why = "unavailable: `rdma_ctl` is not installed on this machine"
    broken = {("rdma_ctl", "status"): CommandResult(None, why),
              ("system_profiler", "SPThunderboltDataType", "-json"):
              CommandResult(None, "unavailable: `system_profiler SPThunderboltDataType -json` "
                                  "took longer than 20 s"),
              ("ifconfig", "bridge0"):
              CommandResult(None, "unavailable: `ifconfig bridge0` exited with status 1: "
                                  "ifconfig: interface bridge0 does not exist")}
    report = probe_platform(system="darwin", runner=replay(MAC / "pair/studio", broken))
    assert report.rdma.unavailable == why and report.rdma.enabled is None
    assert "took longer than 20 s" in (report.thunderbolt.unavailable or "")
    assert report.interfaces["en2"] == "thunderbolt"  # networksetup still answered
    assert report.warnings == ()


def test_garbage_from_every_command_is_never_a_crash():
    def run(argv: Sequence[str], timeout: float) -> CommandResult:
        return CommandResult("\x00garbage{{{\n")
    report = probe_platform(system="darwin", runner=run)
    assert report.thunderbolt.unavailable and report.rdma.unavailable
    assert report.interfaces == {"lo0": "loopback"}


def test_run_command_bounds_and_explains_failures():
    assert run_command(["shoal-no-such-command-xyz"]).reason == \
        "unavailable: `shoal-no-such-command-xyz` is not installed on this machine"
    r = run_command([sys.executable, "-c", "import sys; print('boom', file=sys.stderr); "
                                           "sys.exit(3)"])
    assert r.stdout is None and "exited with status 3: boom" in (r.reason or "")
    r = run_command([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    assert "took longer than 0.5 s" in (r.reason or "")
    assert run_command([sys.executable, "-c", "print('ok')"]).stdout == "ok\n"


def test_linux_report_has_reasons_and_interface_kinds(tmp_path: Path):
    # A recorded /sys/class/net layout (the files Shoal reads), rebuilt in tmp_path.
    net = tmp_path / "net"

    def iface(name: str, arp: str, *extra: str, driver: str | None = None) -> None:
        d = net / name
        d.mkdir(parents=True)
        (d / "type").write_text(arp + "\n")
        for sub in extra:
            (d / sub).mkdir()
        if driver:
            (tmp_path / "drivers" / driver).mkdir(parents=True, exist_ok=True)
            (d / "device").mkdir()
            (d / "device" / "driver").symlink_to(tmp_path / "drivers" / driver)
    iface("lo", "772")
    iface("eth0", "1", driver="igc")
    iface("wlp2s0", "1", "wireless", driver="iwlwifi")
    iface("thunderbolt0", "1", driver="thunderbolt-net")
    iface("br0", "1", "bridge")
    iface("veth1", "1")
    iface("tun0", "65534")
    report = probe_platform(system="linux", net_root=net)
    assert report.system == "linux"
    assert report.thunderbolt.unavailable and report.rdma.unavailable
    assert "macOS only" in report.rdma.unavailable
    assert report.interfaces == {
        "lo": "loopback", "eth0": "ethernet", "wlp2s0": "wifi", "thunderbolt0": "thunderbolt",
        "br0": "bridge", "veth1": "ethernet", "tun0": "other"}
    assert linux_interface_kinds(tmp_path / "missing") == {}


def test_platform_report_from_garbage_json():
    r = PlatformReport.from_json(["not", "a", "dict"])
    assert r.thunderbolt.unavailable and r.rdma.enabled is None
    r = PlatformReport.from_json({"system": "macos", "interfaces": 3, "warnings": [1, "w"],
                                  "thunderbolt": {"ports": "x"}, "future": {}})
    assert r.interfaces == {} and r.warnings == ("w",)
