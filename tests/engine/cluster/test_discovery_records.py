"""mDNS records from other nodes: good ones become peers; malformed or newer ones never
crash the node."""

from __future__ import annotations

import pytest

from engine.cluster.discovery import parse_record


def test_a_good_record_and_a_newer_one():
    url, f = parse_record(["10.0.0.2"], 8421, {b"id": b"abc", b"name": b"studio", b"proto": b"1"})
    assert url == "http://10.0.0.2:8421" and f["name"] == "studio"
    url, f = parse_record(["10.0.0.3"], 8421, {b"id": b"x", b"proto": b"7", b"gpu_cores": b"80"})
    assert f["gpu_cores"] == "80"  # unknown fields are kept, not trusted


@pytest.mark.parametrize("addresses,port,txt,why", [
    ([], 8421, {b"id": b"a"}, "no IPv4 address"),
    (["10.0.0.2"], 0, {b"id": b"a"}, "not a port"),
    (["10.0.0.2"], "8421", {b"id": b"a"}, "not a port"),
    (["10.0.0.2"], 8421, {}, "no node id"),
    (["10.0.0.2"], 8421, {b"id": b"a", b"proto": b"\xff\xfe"}, "not a number"),
])
def test_malformed_records_are_refused_with_a_reason(addresses, port, txt, why):
    with pytest.raises(ValueError, match=why):
        parse_record(addresses, port, txt)
