"""The model list's rules as plain values: families, the fit badge per variant (this
machine, N machines, too large, the planner's reason), the best quantization for this
machine, what a model is good at, and the filters."""

from dataclasses import replace

from app.catalog import Badge, family_of, fit_badge, group, machines, matches, tags_of
from app.snapshots import node_cards
from engine.records import CatalogModel, FilesAt

GB = 10**9


def cards(*free_gb, total_gb=64):
    """This machine first, then the others, each with `free` GB available."""
    nodes = [{"id": f"n{i}", "name": f"node-{i}", "self": i == 0, "reachable": True,
              "trusted": True, "machine": {"memory": {"total_bytes": total_gb * GB,
                                                       "available_bytes": free * GB}}}
             for i, free in enumerate(free_gb)]
    return node_cards({"nodes": nodes, "links": []})


def entry(name, size_gb, quant="4bit", params=None, **kw):
    return CatalogModel(f"mlx-community/{name.replace(' ', '-')}-{quant}", name,
                        quantization=quant, size_bytes=int(size_gb * GB), parameters=params,
                        **kw)


def named(name):
    return CatalogModel("org/x", name)


def test_families_come_from_the_name():
    assert family_of(named("Qwen3 30B-A3B (MoE)")) == "Qwen3"
    assert family_of(named("Llama 3.3 70B Instruct")) == "Llama 3.3"
    assert family_of(named("Qwen2.5 Coder 32B Instruct")) == "Qwen2.5 Coder"
    assert family_of(named("gpt-oss 20B")) == "gpt-oss"
    assert family_of(named("Mistral Large 2 (123B)")) == "Mistral Large 2"
    assert family_of(CatalogModel("mlx-community/Meta-Llama-3.1-8B-Instruct-4bit",
                                  "Meta-Llama-3.1-8B-Instruct-4bit")) == "Llama 3.1"
    assert family_of(CatalogModel("SmolLM2-135M-Instruct")) == "SmolLM2"
    assert family_of(CatalogModel("tiny-llama-12l")) == "tiny-llama-12l"  # no size: its own


def test_fit_badge_this_machine_n_machines_too_large():
    here = fit_badge(entry("Qwen3 8B", 4.6), cards(20, 30))
    assert here == Badge("ok", "fits this machine", here.tip)
    assert here.tip.startswith("Needs about 5.3 GB; this machine may use 20.0 GB")
    two = fit_badge(entry("Qwen3 32B", 30), cards(20, 30, 10))
    assert two.kind == "warning" and two.text == "needs 2 machines"
    assert two.tip.startswith("Needs about 34.5 GB; the largest machine (node-1) may use "
                              "30.0 GB; two machines together may use 50.0 GB")
    # More than the cluster has: how many machines like this one it would take.
    nine = fit_badge(entry("Llama 3.3 70B", 150), cards(20))
    assert nine.text == "needs 9 machines" and "Add machines in Topology" in nine.tip
    huge = fit_badge(entry("Kimi K2", 5000), cards(20))
    assert huge.kind == "error" and huge.text == "too large"
    # The planner's own verdict, with its reason, wins over the estimate.
    planned = fit_badge(entry("Qwen3 4B", 2, fits=False, fit_basis="planner",
                              fit_reason="node-0 needs 9 GB, has 2 GB"), cards(60))
    assert planned == Badge("error", "too large", "node-0 needs 9 GB, has 2 GB")
    assert fit_badge(entry("X", 0), cards(20)).text == "size unknown"


def linux(total_gb, available_gb, name="box", me=True):
    return {"id": name, "name": name, "self": me, "reachable": True, "trusted": True,
            "machine": {"memory": {"total_bytes": total_gb * GB,
                                   "available_bytes": available_gb * GB,
                                   "rule": "MemAvailable from /proc/meminfo"}}}


def test_the_badge_holds_still_while_other_programs_come_and_go():
    # A 64 GB Linux box reports what is free this second; Shoal may use 84% of its RAM
    # (the planner's rule for a machine known by its RAM), whatever other programs hold.
    model = entry("Qwen3 32B", 30)
    badges = {fit_badge(model, node_cards({"nodes": [linux(64, free)]}))
              for free in (60, 31, 12)}
    (badge,) = badges
    assert badge.text == "fits this machine" and "may use 53.8 GB" in badge.tip


def test_plurals_are_right():
    # A 46 GB model, a 16 GB machine here and a 64 GB one beside it: both, "2 machines".
    two = fit_badge(entry("Big", 40), node_cards({"nodes": [
        linux(16, 1), linux(64, 10, "mini", me=False)]}))
    assert two.text == "needs 2 machines"
    assert machines(1) == "1 machine" and machines(2) == "2 machines"
    assert machines(1, words=True) == "one machine"


def test_the_best_quantization_of_a_size_for_this_machine_is_marked():
    families = group([entry("Qwen3 32B", 18.5, "4bit", 32.8e9),
                      entry("Qwen3 32B", 35, "8bit", 32.8e9),
                      entry("Qwen3 14B", 8.3, "4bit", 14.8e9)], cards(48))
    (qwen,) = families
    assert qwen.name == "Qwen3" and len(qwen.variants) == 3
    best = {v.id: v.best for v in qwen.variants}
    assert best == {"mlx-community/Qwen3-32B-8bit": True,  # 8bit fits in 48 GB: the better
                    "mlx-community/Qwen3-32B-4bit": False,
                    "mlx-community/Qwen3-14B-4bit": False}  # one variant: nothing to pick
    (qwen,) = group([entry("Qwen3 32B", 18.5, "4bit", 32.8e9),
                     entry("Qwen3 32B", 35, "8bit", 32.8e9)], cards(30))
    assert [v.best for v in qwen.variants] == [True, False]  # only 4bit fits in 30 GB


def test_what_a_model_is_good_at_and_the_filters():
    assert tags_of(CatalogModel("mlx-community/Qwen3-8B-4bit")) == ("thinking",)
    assert tags_of(CatalogModel("mlx-community/Qwen2.5-Coder-32B-Instruct-4bit")) == ("code",)
    assert tags_of(CatalogModel("mlx-community/gemma-3-27b-it-4bit")) == ("vision",)
    assert tags_of(CatalogModel("x/Plain-7B")) == ()

    on_disk = replace(entry("Qwen3 8B", 4.6), local=[FilesAt("hf-cache", "/hf/x")])
    peer_only = replace(entry("Qwen3 14B", 8.3), local=[FilesAt("peer", node="mini")])
    (fam,) = group([on_disk, peer_only, entry("Qwen3 235B", 132)], cards(20))
    fits, peer, big = fam.variants
    assert "downloaded" in [b.text for b in fits.badges()]
    assert "on mini" in [b.text for b in peer.badges()] and not peer.downloaded
    assert matches(fits, ["qwen3"], {"fits", "downloaded", "thinking"})
    assert not matches(big, [], {"fits"}) and not matches(peer, [], {"downloaded"})
    assert not matches(fits, ["llama"], set()) and not matches(fits, [], {"code"})
