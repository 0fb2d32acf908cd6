"""The model list as the models view shows it, from the node's catalog entries: grouped by
family, one badge per variant saying whether it fits this machine (or how many machines
it needs, or that it is too large, with the planner's reason where the node gave one),
what it is good at (thinking, code, vision, embedding) and whether it is downloaded, and which
variant of a size suits this machine best. Qt-free: tested as plain values."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from app.common import fmt_bytes
from app.snapshots import NodeCard
from engine.records import CatalogModel

HEADROOM = 1.15  # weights plus KV cache and activations, as engine.hub.catalog counts
MOST_MACHINES = 16  # beyond this many machines like this one, a model is "too large"
SIZE = re.compile(r"^(?:\d+(?:\.\d+)?[bBmMkK]|\d+x\d+[bB]|a\d+(?:\.\d+)?b|\(\d+[bB]\))$",
                  re.IGNORECASE)
QUANT = re.compile(r"^(?:\d+bit|mxfp4|fp8|bf16|f16|f32|q\d.*|dwq|mlx)$", re.IGNORECASE)
FILLER = {"instruct", "it", "chat", "(moe)", "hf"}
THINKING = ("qwen3-", "qwq", "deepseek-r1", "-r1-", "gpt-oss", "thinking", "reasoning",
            "magistral")
CODE = ("coder", "codestral", "devstral", "starcoder", "codellama", "code-")
VISION = ("-vl", "vision", "llava", "gemma-3", "llama-4", "pixtral", "smolvlm")
FILTERS = (("fits", "Fits this machine"), ("downloaded", "Downloaded"),
           ("thinking", "Thinking"), ("code", "Code"), ("vision", "Takes images"))
TAG_TIPS = {"thinking": "Reasons before it answers (shown folded in the chat)",
            "code": "Tuned for programming",
            "vision": "Takes images: attach, paste or drop one in the chat",
            "vision?": "Its name says it reads images; Shoal can't tell until it is "
                       "downloaded (it may run its text part only)",
            "embedding": "Turns text into vectors for search (/v1/embeddings); served "
                         "beside a chat model",
            "reranker": "Orders passages by relevance to a query (/v1/rerank)"}


@dataclass(frozen=True)
class Badge:
    kind: str  # ok | warning | error | info | plain (the style sheet's badge roles)
    text: str
    tip: str = ""


@dataclass(frozen=True)
class Variant:
    entry: CatalogModel
    fit: Badge
    tags: tuple[str, ...]  # thinking, code, vision, embedding, reranker
    downloaded: bool
    best: bool = False  # the variant of its size that suits this machine best

    @property
    def id(self) -> str:
        return self.entry.id

    @property
    def label(self) -> str:
        quant = self.entry.quantization
        return (self.entry.name or self.id) + (f" · {quant}" if quant else "")

    def badges(self) -> list[Badge]:
        out = [self.fit]
        if self.best:
            out.append(Badge("info", "best for this machine",
                             "The largest quantization of this size that fits here"))
        if self.downloaded:
            out.append(Badge("plain", "downloaded", ", ".join(where(self.entry))))
        elif peers := [x for x in self.entry.local if x.source == "peer"]:
            names = ", ".join(str(x.node) for x in peers)
            out.append(Badge("plain", f"on {names}", "Copied from there, not the Hub"))
        guessed = capabilities_of(self.entry.capabilities) is None
        out += [Badge("plain", tag, TAG_TIPS[f"{tag}?" if guessed and tag == "vision"
                                             else tag]) for tag in self.tags]
        return out


@dataclass(frozen=True)
class Family:
    name: str
    variants: tuple[Variant, ...]


def where(entry: CatalogModel) -> list[str]:
    return [x.path or x.source for x in entry.local if x.source != "peer"]


def family_of(entry: CatalogModel) -> str:
    """'Qwen3 30B-A3B (MoE)' → 'Qwen3'; 'Llama 3.3 70B Instruct' → 'Llama 3.3';
    'gpt-oss 20B' → 'gpt-oss'; a local folder 'SmolLM2-135M-Instruct' → 'SmolLM2'."""
    name = (entry.name or entry.id or "?").split("/")[-1]
    words = name.split() if " " in name else name.split("-")
    if " " not in name and len(words) > 1 and words[0].lower() == "meta":
        words = words[1:]  # Meta-Llama-3.1 is Llama 3.1
    out, stopped = [], False
    for w in words:
        if SIZE.match(w) or SIZE.match(w.split("-")[0]) or QUANT.match(w):
            stopped = True
            break
        if w.lower() in FILLER:
            continue
        out.append(w)
    if not out or (" " not in name and not stopped):
        return name  # a folder name with no size in it: its own family
    family = " ".join(out)
    return family if " " in name else family[:1].upper() + family[1:]


def capabilities_of(value: Any) -> list[str] | None:
    """What a node says a model does, as a list of names; None when it doesn't say, or
    says something that isn't a list of names (a node is not trusted to send types)."""
    if not isinstance(value, list):
        return None
    return [c for c in value if isinstance(c, str)]


def tags_of(entry: CatalogModel) -> tuple[str, ...]:
    """What the model is good at: thinking and code from its name; vision, embedding and
    reranker from what the node read in its config (capabilities), or, where the node
    doesn't know (a curated or Hub entry not downloaded), vision from the name."""
    text = f"{entry.id} {entry.name}".lower().replace(" ", "-")
    caps = capabilities_of(entry.capabilities)
    named = [tag for tag, marks in (("thinking", THINKING), ("code", CODE))
             if any(m in text for m in marks)]
    if caps is None:
        return tuple(named + (["vision"] if any(m in text for m in VISION) else []))
    if "generate" not in caps:  # an embedding model or reranker: it neither thinks nor codes
        named = []
    return tuple(named + [tag for tag, cap in (("vision", "vision"), ("embedding", "embed"))
                          if cap in caps]
                 + (["reranker"] if caps == ["rerank"] else []))


def downloaded(entry: CatalogModel) -> bool:
    return any(x.source != "peer" for x in entry.local)


WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def machines(n: int, words: bool = False) -> str:
    """'1 machine', '2 machines' (or 'two machines', for sentences)."""
    count = WORDS[n] if words and 0 <= n < len(WORDS) else str(n)
    return f"{count} machine{'' if n == 1 else 's'}"


def spread(strategy: str | None, n: int) -> str:
    """How a model runs, in plain words: "on 3 machines, split by layers"."""
    if n <= 1:
        return "on 1 machine"
    how = "each layer shared between them" if strategy == "tensor" else "split by layers"
    return f"on {machines(n)}, {how}"


def fit_badge(entry: CatalogModel, cards: list[NodeCard]) -> Badge:
    """Fits this machine / needs N machines / too large, and why, as a badge. It counts
    the memory Shoal may use on each machine (MemoryBar.usable), not what is free this
    second, so it doesn't flip as other programs' memory moves."""
    size = entry.size_bytes
    if entry.fit_basis == "planner" and entry.fits is False:
        return Badge("error", "too large", entry.fit_reason or
                     "The planner finds no placement that fits.")
    me = next((c for c in cards if c.is_self and c.memory), None)
    if not size or me is None or me.memory is None:
        return Badge("plain", "size unknown" if not size else "fit unknown",
                     "The node hasn't said how large it is" if not size else
                     "This machine's memory isn't known yet")
    need = int(size * HEADROOM)
    here = me.memory.usable
    basis = ("the planner's check" if entry.fit_basis == "planner" else
             "an estimate from its size: planning it checks exactly")
    if need <= here:
        return Badge("ok", "fits this machine", f"Needs about {fmt_bytes(need)}; this "
                     f"machine may use {fmt_bytes(here)} ({basis}).")
    others = sorted(((c.memory.usable, c.name) for c in cards
                     if c.usable and not c.is_self and c.memory), reverse=True)
    total, n = here, 1
    for room, _name in others:
        if total >= need:
            break
        total, n = total + room, n + 1
    largest, name = max([(here, me.name), *others])
    said = (f"Needs about {fmt_bytes(need)}; the largest machine ({name}) may use "
            f"{fmt_bytes(largest)}; ")
    if total >= need:
        return Badge("warning", f"needs {machines(n)}",
                     f"{said}{machines(n, words=True)} together may use {fmt_bytes(total)} "
                     f"({basis}).")
    like = math.ceil(need / here) if here > 0 else MOST_MACHINES + 1
    if like <= MOST_MACHINES:
        return Badge("warning", f"needs {machines(like)}",
                     f"{said}your {machines(n, words=True)} together may use "
                     f"{fmt_bytes(total)}: it takes about {machines(like)} like this one "
                     f"({fmt_bytes(here)} each for Shoal). Add machines in Topology.")
    return Badge("error", "too large",
                 f"{said}more than {MOST_MACHINES} machines like this one couldn't hold it.")


def _bits(entry: CatalogModel) -> float:
    quant = (entry.quantization or "").lower()
    m = re.match(r"(\d+)bit", quant)
    if m:
        return float(m.group(1))
    return {"mxfp4": 4.25, "fp8": 8.0, "bf16": 16.0, "f16": 16.0, "f32": 32.0}.get(quant, 0.0)


def group(entries: Iterable[CatalogModel], cards: list[NodeCard]) -> list[Family]:
    """Families in the order their first entry came (the node lists downloaded models
    first), each variant with its badges; per family and size, the variant with the most
    bits that fits this machine is marked best."""
    families: dict[str, list[Variant]] = {}
    for e in entries:
        v = Variant(e, fit_badge(e, cards), tags_of(e), downloaded(e))
        families.setdefault(family_of(e), []).append(v)
    out = []
    for name, variants in families.items():
        by_size: dict[Any, list[Variant]] = {}
        for v in variants:
            by_size.setdefault(v.entry.parameters or v.id, []).append(v)
        best = set()
        for same in by_size.values():
            fitting = [v for v in same if v.fit.kind == "ok"]
            if len(same) > 1 and fitting:
                best.add(max(fitting, key=lambda v: _bits(v.entry)).id)
        out.append(Family(name, tuple(Variant(v.entry, v.fit, v.tags, v.downloaded,
                                              v.id in best) for v in variants)))
    return out


def matches(v: Variant, words: list[str], filters: set[str]) -> bool:
    """Does the variant pass the search words and the ticked filters?"""
    text = f"{v.id} {v.entry.name} {family_of(v.entry)}".lower()
    if not all(w in text for w in words):
        return False
    if "fits" in filters and v.fit.kind != "ok":
        return False
    if "downloaded" in filters and not v.downloaded:
        return False
    return all(tag in v.tags for tag in ("thinking", "code", "vision") if tag in filters)
