"""The prefix KV cache: mlx-lm's LRUPromptCache, with what serving across nodes needs.

- A lookup always leaves at least the prompt's last token to run, for the next logits; a
  longer entry is trimmed to the common prefix (trimmable caches only: linear-attention
  state can't be rewound, so hybrid models hit only on entries that are a prefix of the
  prompt, which is what a growing chat gives).
- Entries are keyed by exactly the tokens their KV holds: the prompt and every token fed
  back, i.e. what the model sampled, so a client replaying its tool calls still hits.
- Eviction is LRU within a token budget and an entry count, both identical on every rank
  of a group; followers don't evict by themselves but trim to the count rank 0 kept, so
  their tries hold the same keys and make the same decision for every prompt.
- A request whose client leaves mid-prefill keeps what its chunks computed (partial()),
  so a retry of the prompt (an SDK's timeout, Stop and send again) starts where it stopped.
  It is kept once, at the cancel, as the cache stands then: no copy per chunk, and one
  entry per prompt (a longer one replaces it), in memory only.
- With a disk tier (engine/runtime/disk_cache.py) finished prompts are also written to
  the SSD. In one process a lookup that finds more there than in memory loads it; a
  group's ranks read their disks only as the group forms (engine/runtime/group/disk.py),
  since disks on different nodes can't promise every rank the same hit.
"""

from __future__ import annotations

import copy
import logging
import threading
from typing import Any

log = logging.getLogger(__name__)

KEY = "model"  # one model per worker: the trie needs a key, any constant will do


def default_budget(context_length: int) -> int:
    """Tokens the prefix cache may hold: what the planner's memory check counts for it."""
    from engine.placement.model import planning_context
    from engine.placement.tables import DEFAULT

    return int(planning_context(context_length) * DEFAULT.prefix_cache_contexts)


class PrefixCache:
    def __init__(self, budget_tokens: int, max_entries: int = 16, leader: bool = True,
                 disk: Any = None, disk_lookups: bool = True):
        from mlx_lm.models.cache import LRUPromptCache

        self.budget_tokens, self.leader = budget_tokens, leader
        self.disk = disk  # engine.runtime.disk_cache.DiskCache, or None
        self.disk_lookups = disk_lookups and disk is not None
        self.lru = LRUPromptCache(max_size=max_entries if leader else 1 << 30)
        self.hits = self.lookups = 0
        self._snapshot: tuple[list[int], list[Any]] | None = None
        self._partials: list[list[int]] = []  # keys partial() stored, until superseded
        # KV another node prefilled (adopt()), kept at the next lookup, on the thread
        # that serves requests: the only one that touches the entries
        self._adopted: list[tuple[list[int], list[Any]]] = []
        self._adopting = threading.Lock()

    def __len__(self) -> int:
        return len(self.lru)

    @property
    def nbytes(self) -> int:
        return int(self.lru.nbytes)

    def tokens(self) -> int:
        """Tokens held over all entries (mlx-lm 0.32.2 keeps them in its LRU deques)."""
        return sum(len(t) for lru in self.lru._lru._lrus.values() for _, t in lru)

    def fetch(self, prompt: list[int]) -> tuple[list[Any] | None, int]:
        """(a copy of the best cache for `prompt`, how many of its tokens it holds); the
        prompt's last token is always left to run."""
        self.lookups += 1
        self._take_adopted()
        if self.budget_tokens <= 0 or len(prompt) < 2:
            return None, 0
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        cache, rest = self.lru.fetch_nearest_cache(KEY, prompt)
        if self.disk_lookups and self._from_disk(prompt, len(prompt) - len(rest)
                                                     if cache is not None else 0):
            cache, rest = self.lru.fetch_nearest_cache(KEY, prompt)
        if cache is not None and not rest:  # an exact hit: its last token must run again
            if can_trim_prompt_cache(cache):
                trim_prompt_cache(cache, 1)
                rest = prompt[-1:]
            else:  # recurrent state can't be rewound: the best entry short of it
                cache, rest = self.lru.fetch_nearest_cache(KEY, prompt[:-1])
                rest = [*rest, prompt[-1]]
        if cache is None:
            return None, 0
        self.hits += 1
        return cache, len(prompt) - len(rest)

    def peek(self, prompt: list[int]) -> int:
        """How many of `prompt`'s tokens a lookup would find now (no copy is made; from
        any thread, so a lookup racing an insert may read 0)."""
        if self.budget_tokens <= 0:
            return 0
        try:
            with self._adopting:
                waiting = max((len(t) for t, _ in self._adopted
                               if prompt[:len(t)] == t), default=0)
            r = self.lru._trie.search(KEY, prompt)
            n = len(r.exact) if r.exact is not None else \
                max(len(r.shorter) if r.shorter is not None else 0,
                    r.common_prefix if r.longer is not None else 0)
        except Exception:  # the trie changed under us: say nothing is held
            return 0
        return min(max(n, waiting), len(prompt) - 1)

    def mark(self, prompt: list[int], cache: list[Any]) -> None:
        """`cache` now holds all of `prompt` but its last token. Recurrent state can't be
        rewound, so keep a copy of it here: the next turn of the chat (or a resend) starts
        with these tokens even when the reply it carries differs from what was sampled."""
        from mlx_lm.models.cache import can_trim_prompt_cache

        if self.budget_tokens > 0 and len(prompt) > 1 and not can_trim_prompt_cache(cache):
            self._snapshot = (list(prompt[:-1]), copy.deepcopy(cache))

    def snapshot(self, prompt: list[int], cache: list[Any]) -> None:
        """As mark(), but kept at once: with many requests in flight the next finish()
        may be another request's. Same on every rank (followers evict as rank 0 says)."""
        self.mark(prompt, cache)
        snap, self._snapshot = self._snapshot, None
        if snap:
            self._store(*snap)
            self._evict()

    def finish(self, tokens: list[int], cache: list[Any]) -> None:
        """A request ended with `cache` holding exactly `tokens`: keep it (and the mark's
        copy); rank 0 then evicts LRU entries beyond the budget."""
        snap, self._snapshot = self._snapshot, None
        for key, c in ([snap] if snap else []) + [(tokens, cache)]:
            self._store(key, c)
            if self.disk is not None:
                self.disk.put(list(key), c)
        self._evict()

    def partial(self, tokens: list[int], cache: list[Any]) -> None:
        """A request left mid-prefill with `cache` holding exactly `tokens`, a prefix of its
        prompt: keep it as it stands (the request is over: no copy), so a retry starts
        here. Any cache can resume from a prefix of its prompt, rewindable or not; not on
        disk (a write would delay the retry, and the finished prompt is written anyway).
        Same on every rank of a group (followers evict as rank 0 says)."""
        if self._snapshot is not None and self._snapshot[0] == list(tokens):
            self._snapshot = None  # mark()'s copy of this very state: kept once is enough
        if self.budget_tokens <= 0 or len(tokens) < 2:
            return
        self._store(tokens, cache)
        self._partials.append(list(tokens))
        self._evict()

    def _from_disk(self, prompt: list[int], have: int) -> bool:
        """Load the disk's best entry for `prompt` into memory where it holds more than
        the `have` tokens memory does."""
        from mlx_lm.models.cache import can_trim_prompt_cache

        name, n = self.disk.best(prompt)
        if name is None or n <= have + 1 or n < 2:
            return False
        got = self.disk.load(name)
        if got is None:
            return False
        cache, tokens = got
        if n < len(tokens) and not can_trim_prompt_cache(cache):
            return False
        self.put(tokens, cache)
        return True

    def adopt(self, tokens: list[int], cache: list[Any]) -> bool:
        """Keep `cache`, holding exactly `tokens`, that another node prefilled; from any
        thread (it is stored at the next lookup, past the budget if need be: the request
        that asked for it comes next, and other entries give way first). False where the
        prefix cache is off."""
        if self.budget_tokens <= 0 or not tokens:
            return False
        with self._adopting:
            self._adopted.append((list(tokens), cache))
        return True

    def _take_adopted(self) -> None:
        with self._adopting:
            got, self._adopted = self._adopted, []
        for tokens, cache in got:  # kept even past the budget: the request that asked
            self.lru.insert_cache(KEY, list(tokens), cache)  # for it is the next one
            self._evict()

    def hold(self, tokens: list[int], cache: list[Any]) -> None:
        """Keep `cache`, holding exactly `tokens`, past the budget until the next store
        (a group's ranks each take a handed-over prefill in at the same plan: none may
        evict on its own, engine/runtime/group/state.py apply_adopt)."""
        if self.budget_tokens > 0 and tokens:
            self.lru.insert_cache(KEY, list(tokens), cache)

    def put(self, tokens: list[int], cache: list[Any]) -> None:
        """Keep `cache`, holding exactly `tokens` (an entry read back from disk)."""
        self._store(tokens, cache)
        self._evict()

    def _evict(self) -> None:
        if self.leader:
            while len(self.lru) > 1 and self.tokens() > self.budget_tokens:
                self.lru.trim_to(n_sequences=len(self.lru) - 1)

    def _store(self, tokens: list[int], cache: list[Any]) -> None:
        if self.budget_tokens > 0 and tokens and len(tokens) <= self.budget_tokens:
            self.lru.insert_cache(KEY, list(tokens), cache)
            self._supersede(list(tokens))

    def _supersede(self, tokens: list[int]) -> None:
        """Drop the partial entries `tokens` extends: its retry went further. (mlx-lm
        drops every prefix itself where caches can be trimmed; recurrent state keeps them,
        as a prompt's end is where another turn may branch, but a cut-off prefill is no
        such point.)"""
        lru, left = self.lru, []
        for p in self._partials:
            if len(p) < len(tokens) and tokens[:len(p)] == p:
                if lru._trie.search(KEY, p).exact is not None:  # (may be evicted already)
                    e = lru._trie.pop(KEY, p)
                    lru._n_bytes -= e.nbytes
                    lru._n_bytes_by_type[e.cache_type] -= e.nbytes
                    lru._lru.remove(KEY, p)
            elif p != tokens and lru._trie.search(KEY, p).exact is not None:
                left.append(p)
        self._partials = left

    def drop_oldest(self) -> bool:
        """Give up the least recently used entry (for memory a request needs); False when
        there is none."""
        if not len(self.lru):
            return False
        self.lru.trim_to(n_sequences=len(self.lru) - 1)
        return True

    def keep(self, n: int) -> None:
        """Followers: drop the LRU entries rank 0 dropped (the same ones: same order)."""
        self.lru.trim_to(n_sequences=n)

    def follow(self, ids: list[int], n_prompt: int, n_cached: int, n_keep: int,
               done: list[Any]) -> tuple[list[Any] | None, str | None]:
        """A follower at a new request: `ids` is the prompt, then the tokens of the last
        request, whose cache `done` is; keep it as rank 0 did, drop what rank 0 dropped,
        and take the prefix rank 0 took. Returns (cache or None, why the group is out of
        step)."""
        prompt, prev = ids[:n_prompt], ids[n_prompt:]
        if prev:
            self.finish(prev, done)
        self.keep(n_keep)
        cache, n = self.fetch(prompt)
        if n != n_cached:
            return None, (f"the prefix cache is out of step (rank 0 holds {n_cached} of the "
                          f"prompt's tokens, this rank {n})")
        return cache, None

    def stats(self) -> dict[str, int]:
        return {"entries": len(self), "tokens": self.tokens(), "bytes": self.nbytes,
                "hits": self.hits, "lookups": self.lookups,
                **(self.disk.stats() if self.disk is not None else {})}
