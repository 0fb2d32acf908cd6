"""Which lanes a launch runs (engine/node/launch.py:choose_lanes), rule by rule: what the
user asked for, else the planner's choice, except where it can't gain."""

from __future__ import annotations

import pytest

from engine.api.common import parse
from engine.errors import BadRequest
from engine.node.launch import LaunchRequest, choose_lanes

TWO_MACHINES = ["10.0.0.1", "10.0.0.2"]


@pytest.mark.parametrize("body,strategy,hosts,predicted,streams,lanes", [
    ({}, "pipeline", TWO_MACHINES, 2, 8, 2),               # the planner's choice
    ({}, "pipeline", TWO_MACHINES, 1, 8, 1),
    ({}, "pipeline", ["127.0.0.1"] * 2, 2, 8, 1),          # one machine's memory bus
    ({}, "pipeline", TWO_MACHINES, 2, 1, 1),               # one request at a time
    ({}, "tensor", TWO_MACHINES, 2, 8, 1),
    ({"lanes": 2}, "pipeline", ["127.0.0.1"] * 2, 1, 8, 2),  # asked for: as asked
    ({"lanes": 1}, "pipeline", TWO_MACHINES, 2, 8, 1),
    ({"lanes": 3}, "pipeline", TWO_MACHINES + ["10.0.0.3"], 1, 8, 3),
    ({"lanes": 1}, "tensor", TWO_MACHINES, 1, 8, 1),
])
def test_lanes_are_chosen_by_rule(body, strategy, hosts, predicted, streams, lanes):
    assert choose_lanes(body.get("lanes"), strategy, hosts, predicted, streams) == lanes


@pytest.mark.parametrize("lanes,strategy,streams,words", [
    (0, "pipeline", 8, "from 1 to 2"), (3, "pipeline", 8, "from 1 to 2"),
    (2.0, "pipeline", 8, "whole number"), (None, "pipeline", 8, None),
    ("2", "pipeline", 8, "whole number"), (True, "pipeline", 8, "whole number"),
    (2, "tensor", 8, "from 1 to 1"), (2, "pipeline", 1, "--max-streams 1"),
])
def test_bad_lanes_say_what_is_allowed(lanes, strategy, streams, words):
    """The launch body's type check (LaunchRequest) and then the placement's range, as a
    POST /shoal/instances meets them."""
    body = {"model": "m", "strategy": strategy, "lanes": lanes}
    if words is None:  # JSON null: not asked
        asked = parse(LaunchRequest, body).lanes
        assert choose_lanes(asked, strategy, TWO_MACHINES, 2, streams) == 2
        return
    with pytest.raises(BadRequest) as e:
        asked = parse(LaunchRequest, body).lanes
        choose_lanes(asked, strategy, TWO_MACHINES, 1, streams)
    assert e.value.param == "lanes" and words in e.value.message
    if words == "whole number":
        assert f"not {lanes!r}" in e.value.message
