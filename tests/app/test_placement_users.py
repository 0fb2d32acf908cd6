"""The placement view's "People at once" box against a real two-node cluster on loopback
(the tiny model on both): one person gets one instance, sixteen get a copy on each
machine, as the node's planner says (POST /shoal/plan with "users")."""

from types import SimpleNamespace

import pytest


@pytest.fixture
def view(placement_view, cluster):
    place = placement_view(cluster[0])
    return SimpleNamespace(place=place, users=place.users_verdict, cluster=cluster)


def test_the_verdict_follows_the_number_of_people(qtbot, view):
    users = view.users
    assert users.spin.value() == 1 and users.spin.maximum() == 256
    assert users.spin.accessibleName() == "People at once"
    qtbot.waitUntil(lambda: users.label.text().startswith("For 1 person: "), timeout=30000)
    assert "One instance: for 1 person one copy is enough" in users.label.text()
    asked = users.answer
    assert asked is not None and asked["users"] == 1

    # 32 at once: a copy on each machine serves them all; one instance queues half
    users.spin.setValue(32)
    qtbot.waitUntil(lambda: users.label.text().startswith("For 32 people: "), timeout=30000)
    text = users.label.text()
    assert "Replicas: 2 copies of" in text, text
    row = users.answer
    assert row["winner"] == "replicas" and row["one_instance"]["queued"] == 16
    assert row["replicas"]["queued"] == 0 and row["replicas"]["instances"] == 2
    # the node names both machines among the copies
    ids = {nd.client.status().cluster.id for nd in view.cluster}
    assert {c["nodes"][0] for c in row["replicas"]["copies"]} == ids
