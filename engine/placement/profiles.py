"""Hypothetical hardware for `shoal plan --simulate`: machine, link and model profiles
(already parsed from resources/profiles/*.json) and the simulation file, turned into
NodeSpec, LinkSpec and ModelSpec. Every mistake in a file is reported with the field that
holds it ("nodes[2].memory_gb: ...").

Units in files: memory_gb is RAM as sold (binary gigabytes, as Apple counts it);
usable_gb, like everything `shoal plan` prints, is decimal gigabytes; bandwidth_gbs is
GB/s (decimal); bandwidth_gbit is Gb/s; latency_us is microseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.placement.model import QUANTIZATIONS, LinkSpec, ModelSpec, NodeSpec
from engine.placement.validate import PlacementError
from engine.platform.gpu_memory import mac_gpu_budget
from engine.platform.nvidia import vram_budget

GIB = 2 ** 30


class SimulationError(PlacementError):
    """A simulation or profile file that can't be used; the message names the field."""


@dataclass(frozen=True)
class Simulation:
    nodes: tuple[NodeSpec, ...]
    links: tuple[LinkSpec, ...]
    models: dict[str, ModelSpec] = field(default_factory=dict)
    context: int | None = None


def _num(obj: Mapping[str, Any], key: str, where: str, default: float | None = None,
         positive: bool = True) -> float:
    v = obj.get(key, default)
    if v is None:
        raise SimulationError(f"{where}.{key}: missing")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (positive and v <= 0):
        raise SimulationError(f"{where}.{key}: expected a number > 0, got {v!r}")
    return float(v)


def _flag(obj: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    v = obj.get(key, default)
    if not isinstance(v, bool):
        raise SimulationError(f"{where}.{key}: expected true or false, got {v!r}")
    return v


def _entry(doc: Mapping[str, Any], section: str, name: str, where: str) -> Mapping[str, Any]:
    table = doc.get(section) or {}
    for key, value in table.items():
        if key.lower() == name.lower():
            return value
    raise SimulationError(f"{where}: no {section[:-1]} profile {name!r} (known: "
                          f"{', '.join(sorted(table))})")


def node_from(entry: Any, where: str, machines: Mapping[str, Any]) -> NodeSpec:
    """A node from its numbers, or from a machine profile plus the memory it has."""
    if not isinstance(entry, Mapping):
        raise SimulationError(f"{where}: expected an object with a name, got {entry!r}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise SimulationError(f"{where}.name: missing (every node needs a name)")
    prof: Mapping[str, Any] = {}
    if "profile" in entry:
        if not isinstance(entry["profile"], str):
            raise SimulationError(f"{where}.profile: expected a machine profile name")
        prof = _entry(machines, "machines", entry["profile"], f"{where}.profile")
        options = prof.get("memory_gb") or []
        if "memory_gb" not in entry and "usable_gb" not in entry and len(options) != 1:
            raise SimulationError(f"{where}.memory_gb: {entry['profile']} comes with "
                                  f"{', '.join(map(str, options))} GB; say which")
        if "memory_gb" in entry and options and entry["memory_gb"] not in options:
            raise SimulationError(f"{where}.memory_gb: {entry['profile']} comes with "
                                  f"{', '.join(map(str, options))} GB, not "
                                  f"{entry['memory_gb']!r}")
    merged = {"memory_gb": (prof.get("memory_gb") or [None])[-1],
              "bandwidth_gbs": prof.get("memory_bandwidth_gbs"),
              "tflops": prof.get("fp16_tflops"), "rdma": prof.get("thunderbolt5", False),
              **entry}
    if "usable_gb" in merged:
        usable = _num(merged, "usable_gb", where) * 1e9
    elif "wired_fraction" in merged:
        fraction = _num(merged, "wired_fraction", where)
        if fraction > 1:
            raise SimulationError(f"{where}.wired_fraction: expected at most 1, got "
                                  f"{fraction}")
        usable = _num(merged, "memory_gb", where) * GIB * fraction
    elif prof.get("cuda"):  # an NVIDIA card: its VRAM (a Spark: what CUDA sees), not RAM
        gib = prof.get("cuda_memory_gb") or _num(merged, "memory_gb", where)
        usable = vram_budget(int(gib * GIB))
    else:  # what the node's own probe reports on a Mac without a raised wired limit
        usable = mac_gpu_budget(int(_num(merged, "memory_gb", where) * GIB), None, None)[0]
    return NodeSpec(id=str(entry.get("id") or name), name=name, memory_bytes=int(usable),
                    memory_bandwidth_Bps=_num(merged, "bandwidth_gbs", where) * 1e9,
                    compute_flops=_num(merged, "tflops", where) * 1e12,
                    has_model_files=_flag(merged, "has_model_files", where, False),
                    rdma=_flag(merged, "rdma", where, False),
                    watts=_num(merged, "watts", where) if "watts" in merged
                    else float(prof.get("max_power_w") or 0.0))


def links_from(entry: Any, where: str, presets: Mapping[str, Any],
               names: list[str]) -> list[LinkSpec]:
    """One entry: {"a", "b", "preset" | numbers}, or {"mesh": preset, "nodes": [...]}
    for every pair. An RDMA preset also yields the TCP link the same cable carries."""
    if not isinstance(entry, Mapping):
        raise SimulationError(f"{where}: expected an object, got {entry!r}")
    if "mesh" in entry:
        group = entry.get("nodes", names)
        if not isinstance(group, list) or not all(g in names for g in group):
            raise SimulationError(f"{where}.nodes: expected node names among "
                                  f"{', '.join(names)}, got {group!r}")
        pairs = [(x, y) for i, x in enumerate(group) for y in group[i + 1:]]
        spec: Mapping[str, Any] = {"preset": entry["mesh"]}
    else:
        for end in ("a", "b"):
            if entry.get(end) not in names:
                raise SimulationError(f"{where}.{end}: no node {entry.get(end)!r} (nodes: "
                                      f"{', '.join(names)})")
        if entry["a"] == entry["b"]:
            raise SimulationError(f"{where}: a link joins two different nodes")
        pairs, spec = [(entry["a"], entry["b"])], entry
    kinds = []
    if "preset" in spec:
        if not isinstance(spec["preset"], str):
            raise SimulationError(f"{where}.preset: expected a link preset name")
        p = _entry(presets, "links", spec["preset"], f"{where}.preset")
        kinds.append(p)
        if p.get("tcp"):
            kinds.append(_entry(presets, "links", p["tcp"], f"{where}.preset"))
    else:
        kinds.append(spec)
    out = []
    for k in kinds:
        lat = _num(k, "latency_us", where) / 1e6
        bw = _num(k, "bandwidth_gbit", where) * 1e9 / 8
        rdma = _flag(k, "rdma", where, False)
        out += [LinkSpec(x, y, lat, bw, rdma) for x, y in pairs]
    return out


def model_from(entry: Any, where: str, models: Mapping[str, Any]) -> ModelSpec:
    """A model from a profile ({"profile", "quant"}), a config.json ({"config"}), or its
    architecture numbers (layers, hidden, heads, kv_heads, experts, total_params...)."""
    if not isinstance(entry, Mapping):
        raise SimulationError(f"{where}: expected an object, got {entry!r}")
    bpp = _bytes_per_param(entry, where)
    name = entry.get("name")
    try:
        if "profile" in entry:
            prof = _entry(models, "models", str(entry["profile"]), f"{where}.profile")
            quant = entry.get("quant", prof.get("default_quant", "bf16"))
            spec = profile_model(prof, str(entry["profile"]), quant if bpp is None else None,
                                 where)
            return spec if bpp is None else spec.with_quantization(bpp)
        if "config" in entry:
            if not isinstance(entry["config"], Mapping):
                raise SimulationError(f"{where}.config: expected the config.json object")
            return ModelSpec.from_config(entry["config"], bpp, name=name)
        ints: dict[str, Any] = {k: int(_num(entry, k, where)) for k in
                                ("layers", "hidden", "heads", "vocab")}
        ints["kv_heads"] = int(_num(entry, "kv_heads", where, ints["heads"]))
        ints["head_dim"] = int(_num(entry, "head_dim", where, ints["hidden"] // ints["heads"]))
        for k in ("intermediate", "experts", "active_experts", "moe_intermediate",
                  "total_params", "active_params"):
            ints[k] = int(_num(entry, k, where, 0, positive=False))
        if bpp is None:
            raise SimulationError(f"{where}.bytes_per_param: missing (or give quant)")
        return ModelSpec(name=str(name or "model"), bytes_per_param=bpp,
                         context=int(_num(entry, "context", where, 32768)), **ints)
    except SimulationError:
        raise
    except PlacementError as e:
        raise SimulationError(f"{where}: {e}") from None


def profile_model(prof: Mapping[str, Any], name: str, quant: str | None,
                  where: str = "model") -> ModelSpec:
    """A model profile at a quantization ("4bit", "8bit", "bf16", or the profile's own)."""
    bpp = None
    if quant is not None:
        own = prof.get("quantizations") or {}
        bpp = own.get(quant, QUANTIZATIONS.get(quant))
        if bpp is None:
            raise SimulationError(f"{where}.quant: unknown quantization {quant!r} (known: "
                                  f"{', '.join(sorted({*QUANTIZATIONS, *own}))})")
    label = f"{name} ({quant})" if quant else name
    return ModelSpec.from_config(prof["config"], bpp, name=label)


def _bytes_per_param(entry: Mapping[str, Any], where: str) -> float | None:
    if "bytes_per_param" in entry:
        return _num(entry, "bytes_per_param", where)
    if "quant" in entry and "profile" not in entry:
        q = entry["quant"]
        if q not in QUANTIZATIONS:
            raise SimulationError(f"{where}.quant: unknown quantization {q!r} (known: "
                                  f"{', '.join(QUANTIZATIONS)})")
        return QUANTIZATIONS[q]
    return None


def parse_simulation(data: Any, machines: Mapping[str, Any],
                     models: Mapping[str, Any]) -> Simulation:
    """The whole --simulate file: {"nodes": [...], "links": [...], "models": [...],
    "context": optional}."""
    if not isinstance(data, Mapping):
        raise SimulationError("the file must hold a JSON object with nodes and links")
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise SimulationError("nodes: expected a list of at least one node")
    nodes = [node_from(n, f"nodes[{i}]", machines) for i, n in enumerate(raw_nodes)]
    ids = [nd.id for nd in nodes]
    for i, nid in enumerate(ids):
        if nid in ids[:i]:
            raise SimulationError(f"nodes[{i}].name: {nid!r} is used twice")
    raw_links = data.get("links", [])
    if not isinstance(raw_links, list):
        raise SimulationError("links: expected a list")
    links = [link for i, e in enumerate(raw_links)
             for link in links_from(e, f"links[{i}]", machines, ids)]
    raw_models = data.get("models", [])
    if not isinstance(raw_models, list):
        raise SimulationError("models: expected a list")
    specs: dict[str, ModelSpec] = {}
    for i, e in enumerate(raw_models):
        where = f"models[{i}]"
        if not isinstance(e, Mapping) or not isinstance(e.get("name"), str):
            raise SimulationError(f"{where}.name: missing (every model needs a name)")
        specs[e["name"]] = model_from(e, where, models)
    context = data.get("context")
    if context is not None and (not isinstance(context, int) or context <= 0):
        raise SimulationError(f"context: expected a whole number of tokens, got {context!r}")
    return Simulation(tuple(nodes), tuple(links), specs, context)
