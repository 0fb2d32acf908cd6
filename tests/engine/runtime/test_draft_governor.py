"""The batch's draft governor and prefill scheduling under load (issue 50): drafting stops
within a few passes where guesses are refused, and starts again where they are kept and
cheap; a new arrival's prompt goes in within a few decode steps of a running batch, not
chunk by chunk behind every one of them."""

from __future__ import annotations

import threading

import pytest

from tiny import make_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.runtime.load import load_model

    folder = make_tiny_model(tmp_path_factory.mktemp("gov") / "tiny-llama")
    model, tok, _ = load_model(folder)
    return model, tok


def prompt_of(tok, text: str) -> list[int]:
    return tok.apply_chat_template([{"role": "user", "content": text}],
                                   add_generation_prompt=True)


def wrong_drafting(max_draft: int = 4):
    """Drafting whose prompt lookup always guesses a token the model never says here."""
    from engine.runtime.drafting import Drafting
    from engine.runtime.speculative import PromptLookup

    class Wrong(PromptLookup):
        def propose(self, context: list[int], k: int) -> list[int]:
            super().propose(context, k)
            return [3] * k if k > 0 else []

    class WrongDrafting(Drafting):
        def drafter(self) -> PromptLookup:
            return Wrong()
    return WrongDrafting(max_draft=max_draft)


def run_together(gen, model, tok, asks) -> list[list]:
    got: list[list] = [[] for _ in asks]

    def one(i, prompt, s):
        got[i] = list(gen(model, tok, prompt, s))
    threads = [threading.Thread(target=one, args=(i, p, s)) for i, (p, s) in enumerate(asks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
        assert not t.is_alive()
    return got


def test_refused_guesses_stop_drafting_in_a_batch_and_answers_stay_the_same(tiny):
    """Four greedy answers of 120 tokens, drafting on by default, every guess wrong: the
    shadow guesses show it, so almost no pass runs guesses (at most a couple of probes),
    and each answer is the one drafting off gives."""
    from engine.runtime.batching import Batcher
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.sampling import Sampling

    model, tok = tiny
    drafting = wrong_drafting()
    gen = Batcher(model, tok, PrefixCache(0), 4, drafting=drafting)
    off = Batcher(model, tok, PrefixCache(0), 4)
    asks = [(prompt_of(tok, f"Tell story {i} about the sea."),
             Sampling(max_tokens=120, ignore_eos=True)) for i in range(4)]
    got = run_together(gen, model, tok, asks)
    assert [[r.token for r in g] for g in got] == \
        [[r.token for r in g] for g in run_together(off, model, tok, asks)]
    drafted = sum(g.drafted for g in drafting.governors.values())
    assert drafted <= 2 * 4 * 2  # two probes, two guesses, four rows at most
    assert drafting.shared.alpha < 0.2  # the shadows saw the guesses refused
    assert sum(g[-1].drafted_tokens for g in got) == drafted


def test_the_governor_stops_where_guesses_lose_and_starts_again_where_they_win():
    """Passes timed as on this CPU (each guess column costs r of a plain pass): with every
    guess refused the governor drafts in at most the probes, for a few percent of the
    time; once guesses are kept (a repetitive answer at one stream, r small) it drafts
    within a few passes, and stops again within 16 once they are refused."""
    from engine.runtime.batch_governor import BatchGovernor, Shared

    def run(gov: BatchGovernor, passes: int, kept: bool, r: float) -> tuple[int, float]:
        drafting, spent = 0, 0.0
        for _ in range(passes):
            m = gov.width([gov.length(100)] * gov.size)
            seconds = 1.0 + r * m
            spent += seconds
            if m:
                drafting += 1
                gov.observed_rows([(m, m if kept else 0)] * gov.size, m, seconds)
            else:
                gov.observed_rows([], 0, 1.0)
                for _ in range(gov.size):  # what the shadow guesses showed
                    gov.shadow(4, 4 if kept else 0)
        return drafting, spent

    shared = Shared(max_draft=6)
    batch = BatchGovernor(shared, 8)
    drafting, spent = run(batch, 400, kept=False, r=1.0)
    assert drafting <= 2 and spent <= 400 * 1.03  # drafts cost at most 3%
    one = BatchGovernor(shared, 1)
    run(one, 20, kept=True, r=0.1)  # the answer starts repeating itself
    drafting, _ = run(one, 20, kept=True, r=0.1)
    assert drafting == 20 and one.length(100) >= 4  # every pass drafts, wide
    first = [run(one, 1, kept=False, r=0.1)[0] for _ in range(40)]
    assert sum(first[16:]) == 0  # refused again: one row's passes, it stops within 16


def test_a_larger_batch_doesnt_draft_on_a_smaller_batchs_cheap_guesses():
    """Guesses are kept (answers that copy their prompts) and a 4-sequence batch measured
    a guess column at 0.3 of a pass. A 16-sequence batch that changes at every step
    (requests coming and going, so no pass is timed alone at its size) must not draft on
    that figure: on a CPU a column costs about in proportion to the batch (the first
    16-stream round against mlx_lm.server ran at 0.70x while it did)."""
    from engine.runtime.batch_governor import BatchGovernor, Shared

    shared = Shared(max_draft=6)
    small = BatchGovernor(shared, 4)
    for _ in range(8):
        small.observed_rows([], 0, 1.0)
        for _ in range(4):
            small.shadow(4, 4)
    small.observed_rows([(2, 2)] * 4, 2, 1.6)  # r = 0.3 at 4
    assert abs(shared.r[4] - 0.3) < 1e-9
    assert small.length(100) > 0  # drafting pays at 4
    big = BatchGovernor(shared, 16)
    drafted = sum(1 for _ in range(50) if big.width([big.length(100)] * 16) > 0)
    assert drafted <= 3  # at most the probes, each of which would measure it


def test_a_new_prompt_goes_in_within_a_few_decode_steps_of_a_running_batch(tiny):
    """Three answers decode; a fourth request with a ~1,600-token prompt arrives. Its
    first token comes within about two decode steps per 256 of its tokens: the prompt isn't
    fed in chunks of 16 with a whole batch's decode step after each (100 steps)."""
    from engine.runtime.batching import Batcher
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.sampling import Sampling

    model, tok = tiny
    gen = Batcher(model, tok, PrefixCache(0), 4)
    # as on a slow machine, where a chunk's time target buys the smallest chunk
    gen.chunker.target_s = 1e-6
    counts = [0, 0, 0]
    started = threading.Event()

    def decode(i: int) -> None:
        for r in gen(model, tok, prompt_of(tok, f"Count {i}."),
                     Sampling(max_tokens=400, ignore_eos=True)):
            counts[i] = r.generation_tokens
            if min(counts) >= 20:
                started.set()
    threads = [threading.Thread(target=decode, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    assert started.wait(120)
    long = prompt_of(tok, "The lighthouse keeper wrote in his log. " * 40)  # (bytes)
    assert len(long) >= 1500
    before = list(counts)
    first = next(iter(gen(model, tok, long, Sampling(max_tokens=1))))
    waited = min(c - b for c, b in zip(counts, before, strict=True))
    for t in threads:
        t.join(180)
    assert first.token is not None and all(c == 400 for c in counts)
    assert waited <= 16, f"the new prompt waited {waited} decode steps"


@pytest.mark.parametrize("cheap", [False, True])
def test_a_prompt_ready_to_answer_isnt_held_back_by_the_next_arrivals_prefill(tiny, cheap):
    """Chat turns that arrive while another is moving to decoding (its prompt all in but
    its last token): each step gives its decode tokens only after its prompt work, so
    none whose prompt costs more than a decode step joins until that one has its first
    token (before, the first turn's first token came after the next arrivals had
    prefilled); cheap ones (a turn whose history is cached) join at once. Each arrival is
    timed from inside the scheduler's step, so the moment is certain."""
    import time

    from engine.runtime.batching import Batcher
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.sampling import Sampling

    model, tok = tiny
    gen = Batcher(model, tok, PrefixCache(0), 8)
    # a decode step's worth of prompt tokens: more than these prompts, or fewer
    gen.chunker.one_step = lambda: 100_000 if cheap else 16  # type: ignore[method-assign]
    got: list[list] = [[] for _ in range(4)]

    def one(i: int) -> None:
        for r in gen(model, tok, prompt_of(tok, f"Turn {i}: " + "tell me about tides. " * 6),
                     Sampling(max_tokens=12, ignore_eos=True)):
            got[i].append(r)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    pending = list(threads[1:])
    steps: list[tuple[bool, int]] = []  # (one awaits its first token, prompts joined)
    step = gen._gen.next

    def awaiting() -> bool:
        g = gen._gen
        return any(len(c[0]) == 1 and len(c[0][0]) == 1 for c in g._currently_processing) \
            or any(j.emitted == 0 for u in g._generation_batch.uids
                   if (j := gen._jobs.get(u)) is not None)

    def watched():
        g = gen._gen
        before, waiting = len(g._unprocessed_sequences), awaiting()
        out = step()
        steps.append((waiting, before - len(g._unprocessed_sequences)))
        if pending and awaiting():  # the next turn arrives now
            pending.pop(0).start()
            deadline = time.monotonic() + 10
            while gen._inbox.empty() and time.monotonic() < deadline:
                time.sleep(0.001)
        return out
    gen._gen.next = watched
    threads[0].start()
    deadline = time.monotonic() + 60
    while pending and time.monotonic() < deadline:
        time.sleep(0.01)
    for t in threads:
        t.join(120)
        assert not t.is_alive()
    assert all(len(g) == 12 for g in got)
    assert sum(1 for w, _ in steps if w) >= 3  # every arrival came at such a moment
    joined = [s for s in steps if s[0] and s[1]]
    assert bool(joined) == cheap, steps


def test_one_row_drafting_doesnt_bring_probes_back_to_a_large_batch():
    """One stream drafts (guesses kept, a column costs little there), and a 16-row batch
    measured a column at a whole pass. Each time the one row drafts, the 16-row batch's
    probes must not start again at its first pace: in the benchmark against mlx_lm.server
    the 1- and 4-stream runs drafted, and every 16-stream run after them probed anew."""
    from engine.runtime.batch_governor import PROBE_EVERY, BatchGovernor, Shared

    shared = Shared(max_draft=6)
    one, big = BatchGovernor(shared, 1), BatchGovernor(shared, 16)
    for _ in range(8):
        one.observed_rows([], 0, 1.0)
        one.shadow(4, 4)
    one.observed_rows([(2, 2)], 2, 1.2)  # r = 0.1 at one row
    big.observed_rows([], 0, 1.0)
    big.observed_rows([(2, 2)] * 16, 2, 3.0)  # r = 1 at 16: guesses never pay there
    probes = 0
    for _ in range(40):  # turns: one row drafts, then the batch runs 16 passes
        assert one.length(100) > 0
        probes += sum(big.width([big.length(100)] * 16) > 0 for _ in range(PROBE_EVERY))
    assert probes <= 6  # backing off (16, 32, 64 ... passes), not one every 16 passes
