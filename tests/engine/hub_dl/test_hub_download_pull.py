"""Pulling with the real huggingface_hub client against the local Hub: progress, the
cache layout other tools read, verification, re-fetching a damaged file, a connection
that drops mid-file, and fetching only the shard a pipeline rank needs."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from hub_models import BIG, SHARDED

from engine.hub import download
from engine.hub.download import pull, repo_dir, verify_snapshot
from engine.hub.errors import HubUnreachable
from engine.hub.shards import files_for_layers


def test_pull_shows_progress_and_fills_the_hf_cache(hub, hf_env: Path) -> None:
    seen = []
    snap = pull(SHARDED, progress_cb=seen.append)
    repo = hub.repos[SHARDED]
    assert snap == repo_dir(hf_env, SHARDED) / "snapshots" / repo.commit
    assert (repo_dir(hf_env, SHARDED) / "refs" / "main").read_text() == repo.commit
    for path, f in repo.files.items():
        link = snap / path
        assert link.is_symlink() and not os.path.isabs(os.readlink(link))
        assert Path(os.path.realpath(link)).name == (f.sha256 if f.lfs else f.git_sha1)
        assert hashlib.sha256(link.read_bytes()).hexdigest() == f.sha256
    last = seen[-1]
    assert last.done == last.total == sum(f.size for f in repo.files.values())
    assert all(f.state == "done" and f.source == "hub" for f in last.files)
    assert [p.done for p in seen] == sorted(p.done for p in seen)  # never goes back
    # other tools find it where they look: huggingface_hub itself, and Shoal's listing
    from huggingface_hub import try_to_load_from_cache

    from engine.hub.local import find_local_model
    assert try_to_load_from_cache(SHARDED, "config.json", cache_dir=hf_env) == \
        str(snap / "config.json")
    assert find_local_model(hf_env.parent / "none", SHARDED).path == snap
    # a second pull verifies what is there and fetches nothing
    hub.reset_counters()
    assert pull(SHARDED) == snap
    assert hub.served() == 0


def test_a_damaged_file_in_the_cache_is_fetched_again(hub, hf_env: Path) -> None:
    snap = pull(SHARDED)
    victim = "model-00002-of-00003.safetensors"
    blob = Path(os.path.realpath(snap / victim))
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one bit off: only the hash can tell
    blob.write_bytes(bytes(data))
    assert verify_snapshot(snap) == [victim]  # what a loader can check, offline
    hub.reset_counters()
    pull(SHARDED)
    f = hub.repos[SHARDED].files[victim]
    assert hub.served() == hub.served(SHARDED, victim) == f.size
    assert hashlib.sha256((snap / victim).read_bytes()).hexdigest() == f.sha256


def test_a_dropped_connection_resumes_without_fetching_bytes_again(hub, hf_env) -> None:
    f = hub.repos[BIG].files["model.safetensors"]
    hub.drop_after("model.safetensors", 300_000)
    snap = pull(BIG)
    gets = [r for r in hub.file_requests("model.safetensors") if r["method"] == "GET"]
    assert [(r["start"], r["status"]) for r in gets] == [(0, 200), (300_000, 206)]
    assert hub.served(BIG, "model.safetensors") == f.size
    assert hashlib.sha256((snap / "model.safetensors").read_bytes()).hexdigest() == f.sha256


def test_a_network_that_stays_down_gives_a_clean_error_and_nothing_loadable(
        hub, hf_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(download, "RETRIES", 2)
    monkeypatch.setattr(download, "BACKOFF_S", 0.01)
    hub.drop_after("model.safetensors", 200_000)
    orig_take = hub._take_fault

    def take(path):
        got = orig_take(path)
        if got is not None:
            hub.down = True  # after this response is cut, the network is gone
        return got
    monkeypatch.setattr(hub, "_take_fault", take)
    with pytest.raises(HubUnreachable) as e:
        pull(BIG)
    assert "resume" in e.value.message
    repo = repo_dir(hf_env, BIG)
    snap = repo / "snapshots" / hub.repos[BIG].commit
    assert not (snap / "model.safetensors").exists() and not (snap / "config.json").exists()
    from engine.hub.local import list_local_models
    assert list_local_models(hf_env.parent / "none") == []
    sha = hub.repos[BIG].files["model.safetensors"].sha256
    partial = repo / "blobs" / f"{sha}.incomplete"
    assert partial.stat().st_size == 200_000
    hub.down = False  # the cable is back: the next pull resumes where it stopped
    hub.reset_counters()
    pull(BIG)
    gets = [r for r in hub.file_requests("model.safetensors") if r["method"] == "GET"]
    assert [r["start"] for r in gets] == [200_000]


def test_a_pipeline_rank_fetches_only_its_shard(hub, hf_env: Path) -> None:
    snap = pull(SHARDED, layers=(2, 4))  # the last rank: layers 2-3 only (rank 0 runs
    names = {p.name for p in snap.iterdir()}  # the norm and the head)
    assert "model-00001-of-00003.safetensors" not in names
    assert {"model-00002-of-00003.safetensors", "config.json",
            "model.safetensors.index.json", "tokenizer.json"} <= names
    assert hub.served(SHARDED, "model-00001-of-00003.safetensors") == 0
    # the first rank adds shard 1 (embeddings + layers 0-1) and the head's shard 3
    hub.reset_counters()
    snap = pull(SHARDED, layers=(0, 2))
    served = {r["file"] for r in hub.file_requests() if r["method"] == "GET"}
    assert served == {"model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors"}


def test_files_for_layers_reads_the_index() -> None:
    wm = {"model.embed_tokens.weight": "a", "model.layers.0.mlp.w": "a",
          "model.layers.1.mlp.w": "b", "model.layers.2.mlp.w": "c", "model.norm.weight": "c",
          "lm_head.weight": "d"}
    # rank 0 runs the embedding, the final norm and the head; the others their layers
    assert files_for_layers(wm, (0, 1), 3, True) == {"a", "c", "d"}
    assert files_for_layers(wm, (1, 3), 3, False) == {"b", "c"}
    vision = {**wm, "vision_tower.encoder.layers.2.fc.weight": "v"}  # not a text layer
    assert files_for_layers(vision, (1, 3), 3, False) == {"b", "c"}
    assert files_for_layers(vision, (0, 1), 3, True) == {"a", "c", "d", "v"}
    with pytest.raises(ValueError):
        files_for_layers(wm, (2, 5), 3, False)


class _Source:
    """A stand-in neighbour: serves files from a folder, optionally damaged."""
    name = "fake-peer"

    def __init__(self, folder: Path, damage: bool = False):
        self.folder, self.damage, self.served = folder, damage, []

    def plan(self, repo_id, revision):
        return None

    def fetch(self, repo_id, commit, f, dest, on_progress, cancel):
        data = (self.folder / f.path).read_bytes()
        if self.damage and f.path.endswith(".safetensors"):
            data = data[:-1] + bytes([data[-1] ^ 1])
        with open(dest, "ab") as out:
            out.write(data[dest.stat().st_size if dest.exists() else 0:])
        on_progress(len(data))
        self.served.append(f.path)
        return "peer fake"


def test_other_sources_come_first_and_damaged_copies_fall_back_to_the_hub(
        hub, hf_env: Path, repos) -> None:
    good = _Source(repos[SHARDED])
    seen = []
    pull(SHARDED, sources=[good], progress_cb=seen.append)
    assert hub.served() == 0 and len(good.served) == len(hub.repos[SHARDED].files)
    assert {f.source for f in seen[-1].files} == {"peer fake"}
    bad = _Source(repos[BIG], damage=True)
    snap = pull(BIG, sources=[bad])
    f = hub.repos[BIG].files["model.safetensors"]
    assert hub.served(BIG) == f.size  # only the damaged file came again, from the Hub
    assert hashlib.sha256((snap / "model.safetensors").read_bytes()).hexdigest() == f.sha256
