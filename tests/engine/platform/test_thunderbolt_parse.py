"""Thunderbolt cabling from macOS output: real captures (tests/fixtures/macos/captured/) and
recordings reshaped to match them (tests/fixtures/macos/, see its README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.platform.thunderbolt import (
    ProbeParseError,
    ThunderboltReport,
    bridge_loop_warning,
    cable_graph,
    cables_between,
    interface_kinds,
    parse_bridge,
    parse_hardware_ports,
    parse_system_profiler,
    thunderbolt_report,
)

MAC = Path(__file__).resolve().parents[2] / "fixtures" / "macos"
REAL = MAC / "captured"


def real_pair() -> dict[str, ThunderboltReport]:
    """The captured M5 Max MacBook Pro and M3 Ultra Mac Studio, cabled to each other. The
    MacBook's networksetup is a capture from another M5 Max MacBook Pro; the Studio's is the
    M3 Ultra recording (Thunderbolt N → en(N+1))."""
    return {"macbook": thunderbolt_report(
                (REAL / "thunderbolt/omlx_m5max_macbookpro_tb5.json").read_text(),
                (REAL / "networksetup/isolation_macB_mbp.txt").read_text()),
            "studio": thunderbolt_report(
                (REAL / "thunderbolt/omlx_m3ultra_studio_tb5.json").read_text(),
                (MAC / "mesh3/studio-a/networksetup_listallhardwareports.txt").read_text())}


def node_report(scenario: str, node: str) -> ThunderboltReport:
    d = MAC / scenario / node
    enabled = (d / "networksetup_getnetworkserviceenabled.txt").read_text().strip() == "Enabled"
    return thunderbolt_report((d / "system_profiler_SPThunderboltDataType.json").read_text(),
                              (d / "networksetup_listallhardwareports.txt").read_text(),
                              (d / "ifconfig_bridge0.txt").read_text(), enabled)


def scenario(name: str) -> dict[str, ThunderboltReport]:
    return {d.name: node_report(name, d.name) for d in sorted((MAC / name).iterdir())}


def test_ports_know_their_interface_and_the_mac_they_face():
    a = node_report("mesh3", "studio-a")
    assert a.unavailable is None and len(a.ports) == 6
    p1 = next(p for p in a.ports if p.receptacle == 1)
    assert (p1.interface, p1.connected, p1.speed_gbps, p1.remote_name, p1.remote_model) == \
        ("en2", True, 80.0, "Mac Studio", "Mac15,14")
    b = node_report("mesh3", "studio-b")
    # studio-a's port 1 names studio-b's port 1 as the Mac at the other end.
    assert p1.remote_uuid == next(p.domain_uuid for p in b.ports if p.receptacle == 1)
    empty = next(p for p in a.ports if p.receptacle == 3)
    assert (empty.connected, empty.remote_uuid, empty.speed_gbps, empty.max_gbps) == \
        (False, None, None, 120.0)


def test_a_display_is_connected_but_not_a_mac():
    a = node_report("mesh3", "studio-a")
    p5 = next(p for p in a.ports if p.receptacle == 5)
    assert p5.connected and p5.remote_uuid is None
    assert set(a.facing()) == {p.remote_uuid for p in a.ports if p.receptacle in (1, 2)}


def test_mesh_of_three_gives_three_cables():
    cables = cable_graph(scenario("mesh3"))
    pairs = {frozenset((c.a.node, c.b.node)): c for c in cables}
    assert set(pairs) == {frozenset(p) for p in (("studio-a", "studio-b"),
                                                 ("studio-a", "studio-c"),
                                                 ("studio-b", "studio-c"))}
    bc = pairs[frozenset(("studio-b", "studio-c"))]
    assert (bc.end_on("studio-b").interface, bc.end_on("studio-c").interface) == ("en3", "en3")
    assert bc.other("studio-b").node == "studio-c" and bc.speed == "80 Gb/s"


def test_chain_of_four_has_only_neighbour_cables():
    cables = cable_graph(scenario("chain4"))
    assert sorted(tuple(sorted((c.a.node, c.b.node))) for c in cables) == [
        ("studio-a", "studio-b"), ("studio-b", "studio-c"), ("studio-c", "studio-d")]
    assert cables_between(cables, "studio-a", "studio-c") == []
    cd = cables_between(cables, "studio-d", "studio-c")[0]
    assert (cd.end_on("studio-d").receptacle, cd.end_on("studio-d").interface) == (4, "en5")


def test_graph_needs_only_one_side_to_name_the_other():
    reports = scenario("pair")
    studio = reports["studio"]
    blind = ThunderboltReport(ports=tuple(
        p.__class__(**{**p.__dict__, "remote_uuid": None}) for p in studio.ports))
    one_sided = cable_graph({"studio": blind, "macbook": reports["macbook"]})
    assert len(one_sided) == 1
    assert one_sided[0].end_on("studio").interface == "en4"
    assert one_sided[0].end_on("macbook").interface == "en2"  # MacBook: Thunderbolt 2 is en2


def test_a_node_without_a_report_just_has_no_cables():
    reports = scenario("mesh3")
    reports["studio-c"] = ThunderboltReport(unavailable="unavailable: peer gone")
    cables = cable_graph(reports)
    assert [(c.a.node, c.b.node) for c in cables] == [("studio-a", "studio-b")]


def test_hardware_ports_map_receptacles_and_kinds():
    hw = parse_hardware_ports((MAC / "pair/macbook/networksetup_listallhardwareports.txt")
                              .read_text())
    assert hw["Thunderbolt 1"] == "en1" and hw["Thunderbolt Bridge"] == "bridge0"
    kinds = interface_kinds({**hw, "Thunderbolt Ethernet Slot 0": "en9", "iPhone USB": "en8"})
    assert kinds == {"lo0": "loopback", "en0": "wifi", "bridge0": "thunderbolt-bridge",
                     "en1": "thunderbolt", "en2": "thunderbolt", "en3": "thunderbolt",
                     "en9": "ethernet", "en8": "other"}


def test_real_networksetup_maps_ports_out_of_order():
    hw = parse_hardware_ports((REAL / "networksetup/isolation_macB_mbp.txt").read_text())
    assert [hw[f"Thunderbolt {n}"] for n in (1, 2, 3)] == ["en1", "en6", "en2"]
    kinds = interface_kinds(hw)
    assert (kinds["en3"], kinds["en10"], kinds["en0"], kinds["bridge0"], kinds["en6"]) == \
        ("ethernet", "ethernet", "wifi", "thunderbolt-bridge", "thunderbolt")


def test_bridge_members_and_state():
    assert parse_bridge((MAC / "chain4/studio-b/ifconfig_bridge0.txt").read_text()) == (
        ("en2", "en3", "en4", "en5", "en6", "en7"), True)
    assert parse_bridge((MAC / "mesh3/studio-a/ifconfig_bridge0.txt").read_text()) == ((), False)
    assert parse_bridge((MAC / "malformed/ifconfig_bridge0_missing.txt").read_text()) == \
        ((), False)


def test_bridge_loop_warning_names_the_ports_and_the_fix():
    w = bridge_loop_warning(node_report("chain4", "studio-b"))
    assert w is not None
    assert "en2, en3" in w and "en4" not in w  # only the ports cabled to Macs
    assert 'networksetup -setnetworkserviceenabled "Thunderbolt Bridge" off' in w
    assert "System Settings › Network" in w
    macbook = node_report("pair", "macbook")
    assert "(bridge0) includes en2," in (bridge_loop_warning(macbook) or "")


def test_no_warning_when_the_bridge_is_off_or_holds_no_cabled_port():
    assert bridge_loop_warning(node_report("mesh3", "studio-a")) is None
    assert bridge_loop_warning(node_report("pair", "studio")) is None
    chain = node_report("chain4", "studio-b")
    off = ThunderboltReport(**{**chain.__dict__, "bridge_service_enabled": False})
    assert bridge_loop_warning(off) is None


@pytest.mark.parametrize("name", ["system_profiler_truncated.json",
                                  "system_profiler_wrong_top.json"])
def test_unreadable_profiler_output_is_unavailable_with_the_reason(name: str):
    report = thunderbolt_report((MAC / "malformed" / name).read_text(), None)
    assert report.ports == () and report.unavailable is not None
    assert report.unavailable.startswith("unavailable: system_profiler")
    with pytest.raises(ProbeParseError):
        parse_system_profiler((MAC / "malformed" / name).read_text())


@pytest.mark.parametrize("text", ["", "null", "[]", '{"SPThunderboltDataType": null}', "\x00\xff"])
def test_garbage_never_raises(text: str):
    assert thunderbolt_report(text, text, text).unavailable


def test_missing_keys_skip_only_the_broken_entries():
    ports, notes = parse_system_profiler(
        (MAC / "malformed/system_profiler_missing_keys.json").read_text())
    by_bus = {p.bus: p for p in ports}
    assert set(by_bus) == {"thunderboltusb4_bus_1", "thunderboltusb4_bus_2",
                           "thunderboltusb4_bus_3"}
    assert by_bus["thunderboltusb4_bus_1"].receptacle is None  # no receptacle tag
    assert by_bus["thunderboltusb4_bus_1"].remote_uuid is None  # _items not a list
    bus2 = by_bus["thunderboltusb4_bus_2"]
    assert bus2.receptacle is None and bus2.speed is None
    assert bus2.remote_uuid == "D3A7F1C9-6E2B-4A85-9F04-1C8B5E7D3A62"  # past the display
    assert any("no domain UUID" in n for n in notes) and len(notes) >= 3


def test_newer_fields_are_ignored():
    report = thunderbolt_report((MAC / "malformed/system_profiler_newer.json").read_text(),
                                (MAC / "mesh3/studio-a/networksetup_listallhardwareports.txt")
                                .read_text())
    (p,) = report.ports
    assert (p.receptacle, p.interface, p.speed_gbps) == (1, "en2", 120.0)
    assert p.remote_uuid == "E4B17C2A-8D35-4F90-A6C3-2B9E5D7F1A08"


def test_a_mac_without_thunderbolt_says_so():
    text = (MAC / "malformed/system_profiler_no_thunderbolt.json").read_text()
    for printed in (text, '[{"Thunderbolt": "no_hardware"}]'):  # wrapped or bare
        report = thunderbolt_report(printed, None)
        assert report.ports == () and report.unavailable == "no Thunderbolt hardware on this Mac"
    assert "no Thunderbolt ports" in (thunderbolt_report('{"SPThunderboltDataType": []}', None)
                                      .unavailable or "")


def test_real_macbook_a_connected_port_has_its_negotiated_speed_and_names_the_peer():
    mbp = real_pair()["macbook"]
    assert mbp.unavailable is None and len(mbp.ports) == 3
    (link,) = [p for p in mbp.ports if p.connected]
    assert (link.receptacle, link.interface, link.speed_gbps) == (1, "en1", 80.0)
    assert (link.remote_name, link.remote_model) == ("Mac Studio", "Mac15,14")
    assert link.remote_rdma is False  # the Studio lists only service_ip: its RDMA is off
    # "Up to 120 Gb/s" is what an empty TB5 port can do, not a 120 Gb/s link.
    for p in mbp.ports:
        if p is not link:
            assert (p.connected, p.speed_gbps, p.max_gbps, p.remote_uuid) == \
                (False, None, 120.0, None)
    assert mbp.generation == 5


def test_real_studio_sees_the_macbook_with_rdma_and_a_drive_that_is_not_a_mac():
    studio = real_pair()["studio"]
    assert len(studio.ports) == 6
    by_port = {p.receptacle: p for p in studio.ports}
    mbp = by_port[2]
    assert (mbp.remote_name, mbp.remote_model, mbp.remote_rdma, mbp.speed_gbps, mbp.via) == \
        ("MacBook Pro", "Mac17,7", True, 80.0, None)
    drive = by_port[4]  # the OWC Envoy Ultra: connected at 80 Gb/s, no domain UUID
    assert drive.connected and drive.speed_gbps == 80.0 and drive.remote_uuid is None
    assert [p.receptacle for p in studio.ports if not p.connected] == [6, 5, 3, 1]
    assert set(studio.facing()) == {mbp.remote_uuid}


def test_real_pair_makes_one_cable_and_each_end_knows_what_the_other_offers():
    (cable,) = cable_graph(real_pair())
    mbp, studio = cable.end_on("macbook"), cable.end_on("studio")
    assert (mbp.receptacle, mbp.interface, studio.receptacle, studio.interface) == \
        (1, "en1", 2, "en3")
    assert cable.speed == "80 Gb/s" and cable.speed_gbps == 80.0 and cable.via is None
    assert (mbp.sees_rdma, studio.sees_rdma) == (False, True)


def test_a_mac_behind_a_dock_is_found_in_the_docks_items():
    reports = scenario("dock")
    docked = next(p for p in reports["studio"].ports if p.receptacle == 5)
    assert (docked.remote_name, docked.via, docked.speed_gbps) == \
        ("MacBook Pro", "ThunderBay Flex 8", 40.0)
    assert docked.remote_uuid in {p.domain_uuid for p in reports["macbook"].ports}
    cables = cable_graph(reports)
    assert sorted((c.end_on("studio").receptacle, c.speed, c.via) for c in cables) == [
        (2, "80 Gb/s", None), (5, "40 Gb/s", "ThunderBay Flex 8")]


def test_thunderbolt_generation_from_the_ports():
    assert node_report("tb4", "macbook-air").generation == 4
    assert node_report("mesh3", "studio-a").generation == 5
    assert ThunderboltReport().generation is None


def test_networksetup_error_keeps_ports_without_interfaces():
    d = MAC / "mesh3/studio-a"
    report = thunderbolt_report((d / "system_profiler_SPThunderboltDataType.json").read_text(),
                                (MAC / "malformed/networksetup_error.txt").read_text())
    assert len(report.ports) == 6 and all(p.interface is None for p in report.ports)
    assert any("port → interface mapping unknown" in n for n in report.notes)


def test_report_round_trips_through_json_and_tolerates_newer_peers():
    r = node_report("chain4", "studio-c")
    assert ThunderboltReport.from_json(r.to_json()) == r
    docked = scenario("dock")["studio"]
    assert ThunderboltReport.from_json(docked.to_json()) == docked
    older = r.to_json()  # a peer from before remote_model / remote_rdma / via
    for port in older["ports"]:
        for key in ("remote_model", "remote_rdma", "via"):
            del port[key]
    assert [p.remote_rdma for p in ThunderboltReport.from_json(older).ports] == [None] * 6
    newer = r.to_json()
    newer["ports"][0]["lanes"] = 2
    newer["something_new"] = True
    assert ThunderboltReport.from_json(newer).ports == r.ports
    assert ThunderboltReport.from_json({"ports": [{"bus": 1}]}).unavailable
    assert ThunderboltReport.from_json("garbage").unavailable  # type: ignore[arg-type]


def test_a_peer_report_with_wrong_types_is_unavailable_not_trusted():
    good = node_report("pair", "studio").to_json()
    bad = {**good, "ports": [{**good["ports"][0], "speed": 80}]}
    r = ThunderboltReport.from_json(bad)
    assert r.ports == () and "speed" in (r.unavailable or "")
