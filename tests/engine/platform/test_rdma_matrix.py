"""RDMA state and the jaccl device matrix from macOS output: real captures
(tests/fixtures/macos/captured/) and recordings shaped like them (tests/fixtures/macos/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.node.topology import thunderbolt_links
from engine.platform.rdma import (
    ENABLE_HELP,
    TB4_FINAL,
    RdmaReport,
    device_matrix,
    link_type,
    needed_pairs,
    pair_link_types,
    parse_ibv_devices,
    parse_rdma_ctl,
    rdma_report,
)
from engine.platform.thunderbolt import ProbeParseError, cable_graph, thunderbolt_report

MAC = Path(__file__).resolve().parents[2] / "fixtures" / "macos"
REAL = MAC / "captured"


def load(scenario: str):
    tb, rdma = {}, {}
    for d in sorted((MAC / scenario).iterdir()):
        tb[d.name] = thunderbolt_report(
            (d / "system_profiler_SPThunderboltDataType.json").read_text(),
            (d / "networksetup_listallhardwareports.txt").read_text())
        rdma[d.name] = rdma_report((d / "rdma_ctl_status.txt").read_text(),
                                   (d / "ibv_devices.txt").read_text())
    return cable_graph(tb), rdma


def test_rdma_ctl_and_ibv_devices():
    assert parse_rdma_ctl("enabled\n") is True
    assert parse_rdma_ctl("disabled\n") is False
    assert parse_ibv_devices((MAC / "mesh3/studio-a/ibv_devices.txt").read_text()) == (
        "rdma_en2", "rdma_en3", "rdma_en4", "rdma_en6", "rdma_en7")
    assert parse_ibv_devices((MAC / "pair/macbook/ibv_devices.txt").read_text()) == ()
    assert parse_ibv_devices((MAC / "malformed/ibv_devices_none.txt").read_text()) == ()


def test_unknown_rdma_ctl_output_is_unavailable_not_a_crash():
    text = (MAC / "malformed/rdma_ctl_unknown.txt").read_text()
    for bad in (text, "", "RDMA is not enabled", "enabled? disabled?"):
        with pytest.raises(ProbeParseError):
            parse_rdma_ctl(bad)
    r = rdma_report(text, None)
    assert r.enabled is None and "rdma_ctl status printed" in (r.unavailable or "")
    assert r.explanation == r.unavailable


def test_disabled_rdma_explains_how_to_enable_it():
    r = rdma_report((MAC / "pair/macbook/rdma_ctl_status.txt").read_text(),
                    (MAC / "pair/macbook/ibv_devices.txt").read_text())
    assert r == RdmaReport(False)
    assert r.explanation == ENABLE_HELP
    for step in ("Recovery", "Terminal", "`rdma_ctl enable`", "restart"):
        assert step in ENABLE_HELP
    missing = rdma_report(None, None, status_reason="unavailable: `rdma_ctl` is not installed")
    assert missing.enabled is None and "not installed" in (missing.explanation or "")


def test_full_mesh_gives_the_matrix():
    cables, rdma = load("mesh3")
    m = device_matrix(["studio-a", "studio-b", "studio-c"], cables, rdma)
    assert m.ok and m.problems == ()
    assert m.to_json() == [[None, "rdma_en2", "rdma_en3"],
                           ["rdma_en2", None, "rdma_en3"],
                           ["rdma_en2", "rdma_en3", None]]
    json.dumps(m.to_json())  # what MLX_IBV_DEVICES holds
    # Rank order is the caller's: rows and columns follow it.
    m2 = device_matrix(["studio-c", "studio-a"], cables, rdma)
    assert m2.to_json() == [[None, "rdma_en2"], ["rdma_en3", None]]


def test_chain_can_not_run_jaccl_and_names_every_missing_pair():
    cables, rdma = load("chain4")
    m = device_matrix(["studio-a", "studio-b", "studio-c", "studio-d"], cables, rdma,
                      names={"studio-a": "Studio A"})
    assert not m.ok and m.matrix is None
    text = "\n".join(m.problems)
    assert "no Thunderbolt cable between Studio A (rank 0) and studio-c (rank 2)" in text
    assert "Studio A (rank 0) and studio-d (rank 3)" in text
    assert "studio-b (rank 1) and studio-d (rank 3)" in text
    # The C-D cable is on D's port 4 (en5), which has no RDMA device.
    assert ("studio-d (rank 3): the cable to studio-c (rank 2) is on Thunderbolt port 4 "
            "(en5, 80 Gb/s), which has no RDMA device rdma_en5") in text
    with pytest.raises(ValueError):
        m.to_json()


def test_ring_needs_neighbours_only_including_the_wraparound():
    cables, rdma = load("chain4")
    ring = device_matrix(["studio-a", "studio-b"], cables, rdma, ring=True)
    assert ring.ok and ring.backend == "jaccl-ring"
    assert ring.to_json() == [[None, "rdma_en2"], ["rdma_en2", None]]
    three = device_matrix(["studio-a", "studio-b", "studio-c"], cables, rdma, ring=True)
    assert three.problems == ("no Thunderbolt cable between studio-a (rank 0) and "
                              "studio-c (rank 2)",)
    assert needed_pairs(4, ring=True) == [(0, 1), (0, 3), (1, 2), (2, 3)]
    assert needed_pairs(2, ring=True) == [(0, 1)]
    assert len(needed_pairs(4, ring=False)) == 6


def test_a_mac_with_rdma_disabled_blocks_jaccl_with_the_fix():
    cables, rdma = load("pair")
    m = device_matrix(["studio", "macbook"], cables, rdma)
    assert m.problems == (f"macbook (rank 1): {ENABLE_HELP}",)
    m = device_matrix(["studio", "ghost"], cables, rdma)
    assert "ghost (rank 1): no RDMA report from this node" in m.problems
    assert device_matrix(["studio"], cables, rdma).problems[0].startswith(
        "jaccl needs at least two nodes")


def test_link_types_per_pair():
    cables, rdma = load("chain4")
    assert pair_link_types("studio-a", "studio-b", cables, rdma) == ("thunderbolt-rdma",)
    assert pair_link_types("studio-c", "studio-d", cables, rdma) == ("thunderbolt-ip",)
    assert pair_link_types("studio-a", "studio-d", cables, rdma) == ()
    assert pair_link_types("studio-a", "studio-a", cables, rdma) == ("loopback",)
    cables, rdma = load("pair")
    assert pair_link_types("studio", "macbook", cables, rdma) == ("thunderbolt-ip",)
    assert [link_type(k) for k in ("ethernet", "wifi", "loopback", "thunderbolt-bridge",
                                   "other")] == ["ethernet", "wifi", "loopback",
                                                 "thunderbolt-ip", None]
    assert link_type("thunderbolt", rdma=True) == "thunderbolt-rdma"


def test_rdma_report_round_trips_and_tolerates_garbage():
    r = RdmaReport(True, ("rdma_en2",))
    assert RdmaReport.from_json(r.to_json()) == r
    assert RdmaReport.from_json({**r.to_json(), "future": 1}) == r
    assert RdmaReport.from_json(None).enabled is None
    assert RdmaReport.from_json({"enabled": "yes"}).enabled is None


def test_a_thunderbolt_4_mac_with_rdma_enabled_is_told_the_state_is_final():
    status = (REAL / "rdma/omlx3037_tb4_rdma_ctl_status.txt").read_text()
    devices = (REAL / "rdma/omlx3037_tb4_ibv_devices_header_only.txt").read_text()
    r = rdma_report(status, devices, thunderbolt=4)
    assert (r.enabled, r.devices) == (True, ())
    assert r.explanation == TB4_FINAL
    assert "Thunderbolt 5" in TB4_FINAL and "no cable, setting or restart changes that" in \
        TB4_FINAL
    assert rdma_report("disabled\n", None, thunderbolt=4).explanation == TB4_FINAL
    # Where the hardware is not known, the cable/restart advice stays, with the TB4 caveat.
    unknown = rdma_report(status, devices).explanation or ""
    assert "connect a Thunderbolt 5 cable" in unknown and "Thunderbolt 4" in unknown
    assert RdmaReport.from_json(r.to_json()) == r


def real_pair_with_rdma_everywhere():
    """The captured TB5 pair, as if both Macs had said `enabled` and listed their device."""
    tb = {"macbook": thunderbolt_report(
              (REAL / "thunderbolt/omlx_m5max_macbookpro_tb5.json").read_text(),
              (REAL / "networksetup/isolation_macB_mbp.txt").read_text()),
          "studio": thunderbolt_report(
              (REAL / "thunderbolt/omlx_m3ultra_studio_tb5.json").read_text(),
              (MAC / "mesh3/studio-a/networksetup_listallhardwareports.txt").read_text())}
    rdma = {"macbook": RdmaReport(True, ("rdma_en1",), thunderbolt=5),
            "studio": RdmaReport(True, ("rdma_en3",), thunderbolt=5)}
    return cable_graph(tb), rdma


def test_per_link_rdma_comes_from_what_the_peer_offers_on_the_cable():
    # On the real pair the MacBook sees only service_ip from the Studio: RDMA is off at the
    # Studio's end of this cable, whatever a report says, so jaccl must not be promised.
    cables, rdma = real_pair_with_rdma_everywhere()
    m = device_matrix(["studio", "macbook"], cables, rdma)
    assert not m.ok
    (problem,) = m.problems
    assert problem.startswith("macbook (rank 1) sees no RDMA service from studio (rank 0) on "
                              "this cable (its Thunderbolt port 1)")
    assert "RDMA is not on at studio (rank 0)'s end" in problem
    assert pair_link_types("studio", "macbook", cables, rdma) == ("thunderbolt-ip",)
    (link,) = thunderbolt_links(cables, rdma)
    assert (link.speed, link.rdma, link.type) == ("80 Gb/s", False, "thunderbolt-ip")
    assert "sees no RDMA service from studio" in link.why


def test_a_thunderbolt_4_link_through_a_dock_is_skipped_for_the_direct_tb5_cable():
    cables, rdma = load("dock")
    m = device_matrix(["studio", "macbook"], cables, rdma)
    assert m.ok and m.to_json() == [[None, "rdma_en3"], ["rdma_en2", None]]
    links = {lk.via: lk for lk in thunderbolt_links(cables, rdma)}
    assert (links[None].rdma, links[None].type) == (True, "thunderbolt-rdma")
    docked = links["ThunderBay Flex 8"]
    assert docked.rdma is False and docked.speed == "40 Gb/s"
    assert "through ThunderBay Flex 8 links at 40 Gb/s, a Thunderbolt 4 link" in docked.why
    assert sorted(pair_link_types("studio", "macbook", cables, rdma)) == [
        "thunderbolt-ip", "thunderbolt-rdma"]


def test_topology_links_on_the_recorded_mesh_all_carry_rdma():
    cables, rdma = load("mesh3")
    links = thunderbolt_links(cables, rdma)
    assert len(links) == 3 and all(lk.rdma and lk.why is None for lk in links)
    assert {lk.speed for lk in links} == {"80 Gb/s"}
