"""The choice of replica for a request (engine/node/routing.py): the same on every node for
the same conversation, kept across its turns, moved off a full or clearly busier replica,
and only the conversations of a replica that leaves move; every name of a model finds the
one name the router goes by."""

from __future__ import annotations

from engine import protocol as wire
from engine.api.conversation import conversation_key
from engine.node.routing import Replica, choose, name_key, ranked, same_name


def rep(node: str, running: int = 0, waiting: int = 0, streams: int = 8,
        url: str | None = "https://peer", sent: int = 0) -> Replica:
    return Replica(node, url, node, None, "single", (node,), running, waiting, streams,
                   sent=sent)


def chat(*turns: tuple[str, str], tools: list | None = None) -> wire.GenerateRequest:
    return wire.GenerateRequest(messages=[{"role": r, "content": c} for r, c in turns],
                                tools=tools)


def test_a_conversations_turns_share_one_key_and_other_conversations_differ():
    first = chat(("system", "You are terse."), ("user", "Plan a trip to Oslo."))
    later = chat(("system", "You are terse."), ("user", "Plan a trip to Oslo."),
                 ("assistant", "Fly, then take the train."), ("user", "And back?"))
    other = chat(("system", "You are terse."), ("user", "Plan a trip to Bergen."))
    assert conversation_key(first) == conversation_key(later) != conversation_key(other)
    tool = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert conversation_key(chat(("user", "Plan a trip to Oslo."), tools=tool)) \
        != conversation_key(chat(("user", "Plan a trip to Oslo.")))
    raw = wire.GenerateRequest(prompt="Once upon a time " * 400)
    assert conversation_key(raw) == conversation_key(
        wire.GenerateRequest(prompt="Once upon a time " * 400 + "the end"))
    assert conversation_key(wire.GenerateRequest()) is None


def test_every_node_ranks_the_same_whatever_order_it_lists_the_replicas():
    reps = [rep(f"node-{i}") for i in range(4)]
    for k in range(50):
        key = f"conversation-{k}"
        assert [r.node for r in ranked(key, reps)] == \
            [r.node for r in ranked(key, list(reversed(reps)))]


def test_keys_spread_over_the_replicas_and_a_leaving_one_moves_only_its_own():
    reps = [rep("a"), rep("b"), rep("c")]
    first = {k: choose(f"k{k}", reps)[0].node for k in range(300)}
    share = {n: list(first.values()).count(n) for n in "abc"}
    assert all(70 < v < 130 for v in share.values()), share
    after = {k: choose(f"k{k}", reps[:2])[0].node for k in range(300)}
    moved = [k for k in first if first[k] != after[k]]
    assert moved and all(first[k] == "c" for k in moved)


def test_load_overrides_the_prefix_only_when_it_matters():
    key = "conv"
    a, b = ranked(key, [rep("a"), rep("b")])
    # one more request on the preferred one: it keeps the conversation (its cache)
    assert choose(key, [rep(a.node, running=1), rep(b.node)])[0].node == a.node
    # SPREAD more: the least loaded takes it
    got, why = choose(key, [rep(a.node, running=3), rep(b.node, running=1)])
    assert (got.node, why) == (b.node, "load")
    # full while the other isn't: the other
    got, why = choose(key, [rep(a.node, running=2, streams=2), rep(b.node, running=1)])
    assert (got.node, why) == (b.node, "load")
    # both full: the hash's, with its queue (no better place)
    got, why = choose(key, [rep(a.node, running=2, waiting=1, streams=2),
                            rep(b.node, running=2, waiting=1, streams=2)])
    assert (got.node, why) == (a.node, "prefix")


def test_without_a_conversation_the_least_loaded_and_this_node_first_among_equals():
    here = rep("z", url=None)
    assert choose(None, [rep("a"), here])[0] is here
    assert choose(None, [rep("a"), rep("z", running=1, url=None)])[0].node == "a"
    assert choose(None, [here]) == (here, "only")


def test_every_name_a_node_takes_for_a_model_finds_the_one_it_is_served_under():
    served = ["SmolLM2-135M-Instruct", "mlx-community/Qwen3-4B-4bit", "all-MiniLM-L6-v2"]
    for alias, meant in (("SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct"),
                         ("SmolLM2-135M-Instruct:latest", "SmolLM2-135M-Instruct"),
                         ("smollm2-135m-instruct", "SmolLM2-135M-Instruct"),
                         ("MLX-Community/qwen3-4b-4bit:latest", "mlx-community/Qwen3-4B-4bit"),
                         ("all-minilm", "all-MiniLM-L6-v2"),
                         ("sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2")):
        assert same_name(alias, served) == meant, alias
    # a name of no served model stays as it came (the node loads it, or says it has none)
    assert same_name("SmolLM2-360M-Instruct", served) == "SmolLM2-360M-Instruct"
    assert same_name("Qwen3-4B-4bit", served) == "Qwen3-4B-4bit"  # another owner's, maybe
    # two copies served under two names of one model: one name for both, this node's first
    both = ["smollm2-135m-instruct", "SmolLM2-135M-Instruct"]
    assert same_name("SMOLLM2-135M-INSTRUCT", both) == "SmolLM2-135M-Instruct"
    assert same_name("SmolLM2-135M-Instruct", both, prefer="smollm2-135m-instruct") \
        == "smollm2-135m-instruct"
    assert name_key("a" * 5000) == "a" * 5000  # a long name is only a long name


def test_a_wave_of_new_conversations_spreads_evenly_and_a_served_one_stays():
    """Conversations no replica served go to the least loaded (the hash only breaks ties),
    so 8 arriving at once split 4 and 4 where the hash alone split them as chance did; a
    conversation a replica served stays there under the same load."""
    loads = {"a": 0, "b": 0}
    for k in range(8):  # all in flight from this node at once
        got, _ = choose(f"new-{k}", [rep(n, running=v, sent=v) for n, v in loads.items()],
                        served=lambda r: False)
        loads[got.node] += 1
    assert loads == {"a": 4, "b": 4}
    key = "served-before"
    a, b = ranked(key, [rep("a"), rep("b")])
    # the hash prefers a; b served it and is one request busier: it stays on b
    got, why = choose(key, [rep(a.node), rep(b.node, running=1)],
                      served=lambda r: r.node == b.node)
    assert (got.node, why) == (b.node, "prefix")
    # new, nothing in flight from here: the hash's first, even where a peer's last poll
    # said one more request ran there (stale by up to a poll: every node agrees)
    assert choose(key, [rep(a.node), rep(b.node)], served=lambda r: False)[0].node == a.node
    assert choose(key, [rep(a.node, running=1), rep(b.node)],
                  served=lambda r: False)[0].node == a.node
    # new, and one in flight from here to the hash's first: the other
    got, why = choose(key, [rep(a.node, running=1, sent=1), rep(b.node)],
                      served=lambda r: False)
    assert (got.node, why) == (b.node, "load")
    # new, the hash's first SPREAD busier by its poll: the least loaded, as before
    got, why = choose(key, [rep(a.node, running=2), rep(b.node)], served=lambda r: False)
    assert (got.node, why) == (b.node, "load")


def test_a_peers_list_of_conversations_is_checked_before_it_is_used():
    """What a peer says its copy served is read as at most RECENT keys of the right
    length; anything else (a string, numbers, a huge list) counts as nothing or is cut,
    and a new poll's answer is read again."""
    from types import SimpleNamespace

    from engine.node.router import RECENT, SHORT, Router

    peer = SimpleNamespace(id="p1", info=SimpleNamespace(conversations="a" * SHORT))
    cluster = SimpleNamespace(peers=SimpleNamespace(all=lambda: [peer]),
                              node=SimpleNamespace(worker=None))
    router = Router(cluster)
    assert router._theirs("p1") == frozenset()
    good = "0123456789abcdef"
    peer.info = SimpleNamespace(conversations=[good, 7, None, "short", {"k": 1}])
    assert router._theirs("p1") == {good}
    peer.info = SimpleNamespace(conversations=[f"{i:016x}" for i in range(100_000)])
    assert len(router._theirs("p1")) == RECENT
    assert router._theirs("nobody") == frozenset()
