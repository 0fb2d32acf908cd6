"""The note that a model spread over machines on a shared network sends its working data
unencrypted: which placements need it, rule by rule (no Qt)."""

import pytest

from app.link_privacy import NOTE, detail, is_private, shared_links
from app.snapshots import LinkEdge

NAMES = {"a": "studio", "b": "mini", "c": "laptop"}


def edge(a, b, kind):
    return LinkEdge(a, b, kind, 0.4, 110.0)


# --- which placements need the note --------------------------------------------------------
def test_one_machine_needs_no_note():
    assert shared_links(["a"], [edge("a", "b", "ethernet")]) == []
    assert shared_links([], []) == []


def test_two_ranks_on_one_node_are_one_machine():
    assert shared_links(["a", "a"], []) == []


def test_a_loopback_link_needs_no_note():
    """Two nodes on one machine (a test cluster, or two Shoal homes on one Mac)."""
    assert shared_links(["a", "b"], [edge("a", "b", "loopback")]) == []


@pytest.mark.parametrize("kind", ["thunderbolt-rdma", "thunderbolt-ip", "thunderbolt"])
def test_a_thunderbolt_cable_needs_no_note(kind):
    assert shared_links(["a", "b"], [edge("a", "b", kind)]) == []


@pytest.mark.parametrize("kind", ["ethernet", "wifi", "wi-fi", "network", "", "infiniband"])
def test_a_shared_or_unknown_link_needs_the_note(kind):
    assert shared_links(["a", "b"], [edge("b", "a", kind)]) == [("a", "b", kind)]


def test_a_pair_with_no_measured_link_needs_the_note():
    """Until a link is measured nothing says it is a cable: MLX would use the network."""
    assert shared_links(["a", "b"], []) == [("a", "b", None)]


def test_only_the_shared_pairs_are_named_in_rank_order():
    edges = [edge("a", "b", "thunderbolt-rdma"), edge("b", "c", "thunderbolt-ip"),
             edge("c", "a", "wifi")]
    assert shared_links(["a", "b", "c"], edges) == [("a", "c", "wifi")]
    assert shared_links(["c", "b", "a"], edges) == [("c", "a", "wifi")]
    assert shared_links(["a", "b"], edges) == []  # the Wi-Fi pair isn't in this one


def test_every_pair_counts_not_only_neighbours():
    edges = [edge("a", "b", "thunderbolt-rdma"), edge("b", "c", "thunderbolt-rdma")]
    assert shared_links(["a", "b", "c"], edges) == [("a", "c", None)]


@pytest.mark.parametrize("backend", ["jaccl", "jaccl-ring"])
def test_rdma_backends_need_no_note(backend):
    """jaccl runs only over Thunderbolt cables with RDMA, whatever else links the pair."""
    assert shared_links(["a", "b"], [edge("a", "b", "ethernet")], backend) == []
    assert shared_links(["a", "b"], [edge("a", "b", "ethernet")], "ring") != []


def test_the_detail_names_the_machines_the_links_and_mlx():
    text = detail([("a", "b", "ethernet"), ("a", "c", "wifi"), ("b", "c", "network"),
                   ("a", "d", None)], lambda n: NAMES.get(n, n))
    assert text.startswith("studio and mini are linked over Ethernet, studio and laptop "
                           "over Wi-Fi, mini and laptop over a network, studio and d over "
                           "a network (not measured yet). MLX")
    assert "no encryption" in text


def test_the_note_speaks_plainly():
    for word in ("rank", "ring", "MLX", "tensor", "activation"):
        assert word not in NOTE
    assert "unencrypted" in NOTE and "Thunderbolt cable" in NOTE
    assert is_private("loopback") and not is_private("wifi") and not is_private(None)
