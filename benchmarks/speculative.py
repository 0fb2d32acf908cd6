"""Benchmark: speculative decoding on one node, decode tokens/s with and without drafts.

Setup: the bundled SmolLM2-135M loaded as a worker loads it, in this process and with a
worker's environment,
greedy, --tokens per answer, modes interleaved round by round in one run (ratios, not
absolute times: on a shared 2-core machine only those mean something). Workloads:
- code: an agent's edit, "return this file with one change" (the answer repeats the file);
- chat: a story, little repetition: drafting must switch itself off there.
Modes: no drafts; prompt lookup (the node's default); a draft model that is the target
itself (every guess kept: the mechanism's bound where a guess costs a whole token, which
on this CPU it does; MLX's 4-bit CPU kernels are slower than its float32 BLAS ones, so
the bundled model's 4-bit copy would be a slower draft, not a cheaper one).
Every mode's answer is checked to be the same tokens as without drafts.

With --pipeline: the same workloads on a 2-rank pipeline of worker processes (MLX ring over
loopback, SmolLM2 split 15/15, each rank pinned to a core of its own, as on two machines),
one request at a time (so it drafts), `"speculative": false` against the default.

With --batch N: N requests at once through the worker's batcher (engine/runtime/batching.py),
drafting in the batch against drafting off: all code edits, then one code edit beside N-1
chats (the chats ride in the passes that verify the edit's guesses). The figure is the
batch's decode tokens/s: every answer's tokens after its first, over the time from the
first answer's first token to the last answer's end.

Run: .venv/bin/python benchmarks/speculative.py [--tokens 160] [--rounds 3] [--pipeline]
     [--batch 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CODE = "".join(f"def scale_{i}(values):\n    out = []\n    for v in values:\n"
               f"        out.append(v * {i})\n    return out\n\n" for i in range(8))
WORKLOADS = {
    "code": [{"role": "system", "content": "You edit code. Reply with the whole file and "
                                           "nothing else."},
             {"role": "user", "content": "Here is a file:\n\n" + CODE + "\nReturn the whole "
              "file with scale_3 renamed to triple. Keep everything else exactly."}],
    "chat": [{"role": "user", "content": "Tell me a short story about a lighthouse keeper "
                                         "who finds a message in a bottle."}],
}


def decode_tps(records: list) -> float:
    """Tokens after the first over the time since the first (the stream's own clock)."""
    return records[-1].generation_tps


def pipeline(tokens: int, rounds: int) -> None:
    import os
    import shutil

    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT / "tests" / "engine" / "runtime"))
    from dist_harness import Group, generate

    from engine.hub.bundled import ensure_default_model

    tmp = Path(tempfile.mkdtemp(prefix="shoal-spec-pp-"))
    try:
        model = ensure_default_model(tmp / "models")
        g = Group(tmp / "group", model, 2, "pipeline", layers=[[0, 15], [15, 30]],
                  streams=8, timeout_s=120)
        g.ready(300)
        for r, w in enumerate(g.ranks):
            os.sched_setaffinity(w.proc.pid, {r % (os.cpu_count() or 2)})
        got: dict[tuple[str, bool], list[float]] = {}
        kept: dict[tuple[str, bool], tuple[int, int]] = {}
        same: dict[str, bool] = {}
        for i in range(rounds + 1):
            for w, msgs in WORKLOADS.items():
                answers = {}
                for spec in (False, True):
                    # drafts: the node's default (its governor decides), not forced
                    evs = generate(g.leader, f"{w}-{spec}-{i}", msgs, 600,
                                   max_tokens=tokens, **({} if spec else
                                                         {"speculative": False}))
                    done = evs[-1]
                    assert done["ev"] == "done", done
                    answers[spec] = [e["text"] for e in evs if e["ev"] == "delta"]
                    if i:
                        got.setdefault((w, spec), []).append(done["generation_tps"])
                        kept[w, spec] = (done["accepted_tokens"], done["drafted_tokens"])
                        print(f"round {i} {w:5} drafts={spec!s:5} "
                              f"{done['generation_tps']:6.1f} tok/s kept {kept[w, spec]}",
                              flush=True)
                same[w] = same.get(w, True) and answers[False] == answers[True]
        g.kill()
        print("\n| workload | drafts | decode tok/s | ratio | kept / drafted (last round) | "
              "same answer |")
        print("|---|---|---|---|---|---|")
        for w in WORKLOADS:
            base = statistics.median(got[w, False])
            for spec in (False, True):
                med = statistics.median(got[w, spec])
                k, d = kept[w, spec]
                print(f"| {w} | {'prompt lookup' if spec else 'none'} | {med:.1f} | "
                      f"{med / base:.2f} | {k} / {d} | {'yes' if same[w] else 'NO'} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def batched(size: int, tokens: int, rounds: int) -> None:
    import threading

    from engine.hub.bundled import ensure_default_model
    from engine.runtime.batching import Batcher
    from engine.runtime.drafting import Drafting
    from engine.runtime.generate import build_prompt
    from engine.runtime.load import load_model
    from engine.runtime.prefix import PrefixCache
    from engine.runtime.sampling import Sampling

    folder = ensure_default_model(Path(tempfile.mkdtemp(prefix="shoal-spec-")) / "models")
    model, tok, _ = load_model(folder)
    gens = {m: Batcher(model, tok, PrefixCache(0), size, drafting=Drafting(enabled=m))
            for m in (False, True)}
    s = Sampling(max_tokens=tokens, temperature=0.0)
    code, chat = (build_prompt(tok, WORKLOADS[w]) for w in ("code", "chat"))
    mixes = {"all code edits": [code] * size, "one code edit, the rest chats":
             [code] + [chat] * (size - 1)}
    got: dict[tuple[str, bool], list[float]] = {}
    same: dict[str, bool] = {}
    for i in range(rounds + 1):
        for mix, prompts in mixes.items():
            answers = {}
            for on, gen in gens.items():
                outs: list[list] = [[] for _ in prompts]
                stamps: list[tuple[float, float]] = [(0.0, 0.0)] * len(prompts)

                def one(j: int, prompt: list[int], gen=gen, outs=outs,
                        stamps=stamps) -> None:
                    first = 0.0
                    for r in gen(model, tok, prompt, s):
                        outs[j].append(r)
                        first = first or time.perf_counter()
                    stamps[j] = (first, time.perf_counter())
                ts = [threading.Thread(target=one, args=(j, p)) for j, p in enumerate(prompts)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
                n = sum(len(o) - 1 for o in outs)
                tps = n / (max(e for _, e in stamps) - min(f for f, _ in stamps))
                answers[on] = [[r.token for r in o] for o in outs]
                if i:
                    got.setdefault((mix, on), []).append(tps)
                    kept = sum(o[-1].accepted_tokens for o in outs)
                    drafted = sum(o[-1].drafted_tokens for o in outs)
                    print(f"round {i} {mix:30} drafts={on!s:5} {tps:6.1f} tok/s "
                          f"kept {kept} of {drafted}", flush=True)
            same[mix] = same.get(mix, True) and answers[False] == answers[True]
    print(f"\n| batch of {size} | drafts | decode tok/s (the batch) | ratio | same answers |")
    print("|---|---|---|---|---|")
    for mix in mixes:
        base = statistics.median(got[mix, False])
        for on in (False, True):
            med = statistics.median(got[mix, on])
            print(f"| {mix} | {'prompt lookup' if on else 'none'} | {med:.1f} | "
                  f"{med / base:.2f} | {'yes' if same[mix] else 'NO'} |")


def main() -> None:
    from benchmarks.worker_env import as_a_worker_runs
    as_a_worker_runs()
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=160)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pipeline", action="store_true")
    p.add_argument("--batch", type=int, default=0)
    a = p.parse_args()
    if a.batch:
        batched(a.batch, a.tokens, a.rounds)
        return
    if a.pipeline:
        pipeline(a.tokens, a.rounds)
        return
    from engine.hub.bundled import ensure_default_model
    from engine.runtime.drafting import Drafting, drafted_generate
    from engine.runtime.generate import build_prompt
    from engine.runtime.load import load_model
    from engine.runtime.sampling import Sampling

    folder = ensure_default_model(Path(tempfile.mkdtemp(prefix="shoal-spec-")) / "models")
    model, tok, _ = load_model(folder)  # as the worker loads it (float32 on the CPU)
    draft, _, _ = load_model(folder)
    modes = {"none": lambda: Drafting(enabled=False), "lookup": Drafting,
             "draft model": lambda: Drafting(draft_model=draft)}
    made = {m: make() for m, make in modes.items()}  # one governor per mode, as a worker has
    s = Sampling(max_tokens=a.tokens, temperature=0.0)
    got: dict[tuple[str, str], list[float]] = {(w, m): [] for w in WORKLOADS for m in modes}
    answers: dict[tuple[str, str], list[int]] = {}
    accepted: dict[tuple[str, str], tuple[int, int]] = {}
    for i in range(a.rounds + 1):
        for w, msgs in WORKLOADS.items():
            prompt = build_prompt(tok, msgs)
            for m in modes:
                t0 = time.perf_counter()
                recs = list(drafted_generate(made[m], model, tok, prompt, s))
                if i == 0:  # warm-up round: the governor learns, nothing is counted
                    answers[w, m] = [r.token for r in recs]
                    continue
                got[w, m].append(decode_tps(recs))
                accepted[w, m] = (recs[-1].accepted_tokens, recs[-1].drafted_tokens)
                print(f"round {i} {w:5} {m:12} {got[w, m][-1]:6.1f} tok/s "
                      f"({time.perf_counter() - t0:.1f} s, kept {accepted[w, m]})", flush=True)
    print("\n| workload | mode | decode tok/s | ratio | kept / drafted (last round) | "
          "same answer |")
    print("|---|---|---|---|---|---|")
    for w in WORKLOADS:
        base = statistics.median(got[w, "none"])
        for m in modes:
            med = statistics.median(got[w, m])
            kept, drafted = accepted[w, m]
            same = answers[w, m] == answers[w, "none"]
            print(f"| {w} | {m} | {med:.1f} | {med / base:.2f} | {kept} / {drafted} | "
                  f"{'yes' if same else 'NO'} |")
    print(f"\n{tok.decode(answers['code', 'none'])[:400]}")


if __name__ == "__main__":
    main()
