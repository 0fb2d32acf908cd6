"""The worker's own check of a request's token ids, on every path a request is served by,
through the pipe as a node sends it (no API in front): one process alone, with drafts, in
a batch, and a group's rank 0 in lockstep and batched. Each out-of-range id is an error
event naming the field (a 400), a request running beside them answers as alone, and every
process is still up afterwards."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from dist_harness import Group, Worker, collect, collect_all, texts  # noqa: E402

from tiny import LLAMA, make_tiny_model  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="ring over loopback, Linux CI")

HELLO = [{"role": "user", "content": "Tell me a long story"}]
LONG = {"messages": HELLO, "sampling": {"max_tokens": 160, "temperature": 0}}
BAD = [  # (request, the field named)
    ({"messages": HELLO, "sampling": {"max_tokens": 4, "logit_bias": [[259, 5.0]]}},
     "logit_bias"),
    ({"messages": HELLO, "sampling": {"max_tokens": 4, "logit_bias": [[10**9, 5.0]]}},
     "logit_bias"),
    ({"messages": HELLO, "sampling": {"max_tokens": 4, "logit_bias": [[-1, 5.0]]}},
     "logit_bias"),
    ({"prompt": [72, 300], "sampling": {"max_tokens": 4}}, "prompt"),
    ({"prompt": [2**33], "sampling": {"max_tokens": 4}}, "prompt"),
]
PATHS = {  # name: (group strategy or None, streams, extra worker arguments)
    "alone": (None, 1, ("--speculative", "off")),
    "drafts": (None, 1, ("--speculative", "on")),
    "batch": (None, 4, ("--speculative", "on")),
    "pipeline": ("pipeline", 1, ()),
    "pipeline-batch": ("pipeline", 2, ()),
    "tensor": ("tensor", 1, ()),
}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """300 ids in the model, 259 in its tokenizer."""
    return make_tiny_model(tmp_path_factory.mktemp("paths") / "tiny", LLAMA, vocab_size=300)


def _send(w: Worker, rid: str, request: dict) -> None:
    w.send({"op": "generate", "id": rid, "request": request})


@pytest.mark.parametrize("path", [pytest.param(p, marks=[pytest.mark.slow] if PATHS[p][0] else [])
                                  for p in PATHS])  # groups are slow (scripts/test --fast)
def test_every_path_refuses_ids_past_the_model_and_keeps_serving(tmp_path, model, path):
    strategy, streams, extra = PATHS[path]
    group = None
    if strategy is None:
        w = Worker(["--model", str(model), "--model-id", "m", "--streams", str(streams),
                    *extra], tmp_path / "w.log")
        ranks = [w]
        w.expect(lambda e: e["ev"] == "ready")
    else:
        group = Group(tmp_path, model, 2, strategy,
                      [[0, 2], [2, 4]] if strategy == "pipeline" else None, streams=streams)
        ranks, w = group.ranks, group.leader
        group.ready()
    try:
        _send(w, "alone", LONG)
        alone = texts(collect(w, "alone"))
        _send(w, "long", LONG)  # the bad ones arrive while it runs (where it batches)
        for i, (request, _) in enumerate(BAD):
            _send(w, f"bad{i}", request)
        got = collect_all(w, ["long", *(f"bad{i}" for i in range(len(BAD)))])
        for i, (_, param) in enumerate(BAD):
            ev = got[f"bad{i}"][-1]
            assert ev["ev"] == "error" and ev["status"] == 400, ev
            assert ev["param"] == param and "(0 to 258)" in ev["message"], ev
        assert texts(got["long"]) == alone
        _send(w, "after", {"messages": HELLO, "sampling": {"max_tokens": 3,
                                                           "logit_bias": [[258, -100.0]]}})
        assert collect(w, "after")[-1]["ev"] == "done"
        assert [r.proc.poll() for r in ranks] == [None] * len(ranks)
    finally:
        if group is not None:
            group.kill()
        else:
            w.kill()
