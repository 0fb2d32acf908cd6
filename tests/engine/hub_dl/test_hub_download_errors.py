"""What a user can get wrong or can't control, each with a message that says what to do
and nothing half-written left where a loader would pick it up: an unknown repository, one
that isn't an MLX model, a gated one without a token, a revoked token, a full disk, and
HF_HUB_OFFLINE."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hub_models import BIG, GATED, NOT_MLX, SHARDED, TOKEN

from engine.errors import BadRequest, ModelNotFound, UnsupportedModel
from engine.hub import download
from engine.hub.download import pull, repo_dir
from engine.hub.errors import GatedModel, HubOffline, InsufficientDisk, TokenRejected
from engine.hub.local import list_local_models


def _nothing_written(cache: Path, repo_id: str) -> None:
    repo = repo_dir(cache, repo_id)
    assert not (repo / "snapshots").exists() or not any((repo / "snapshots").rglob("*"))
    assert not any(m.id == repo_id for m in list_local_models(cache.parent / "none", cache))


def test_unknown_repository(hub, hf_env: Path) -> None:
    with pytest.raises(ModelNotFound) as e:
        pull("test-org/no-such-model")
    assert "no model 'test-org/no-such-model'" in e.value.message
    assert "Check the name" in e.value.message
    _nothing_written(hf_env, "test-org/no-such-model")
    with pytest.raises(BadRequest, match="owner/name"):
        pull("../etc")


def test_a_repository_that_is_not_an_mlx_model(hub, hf_env: Path) -> None:
    with pytest.raises(UnsupportedModel) as e:
        pull(NOT_MLX)
    assert "no safetensors weights" in e.value.message and ".bin" in e.value.message
    assert "mlx-community" in e.value.message
    _nothing_written(hf_env, NOT_MLX)
    assert hub.served() == 0


def test_a_gated_model_asks_for_a_token(hub, hf_env: Path) -> None:
    with pytest.raises(GatedModel) as e:
        pull(GATED)
    assert "gated" in e.value.message and "shoal models login" in e.value.message
    _nothing_written(hf_env, GATED)
    assert pull(GATED, token=TOKEN).is_dir()  # with a token it downloads


def test_a_gated_model_the_account_may_not_use(hub, hf_env: Path) -> None:
    hub.repos[GATED].granted = {"someone-else"}
    with pytest.raises(GatedModel, match="not been granted access"):
        pull(GATED, token=TOKEN)
    _nothing_written(hf_env, GATED)


def test_a_revoked_token(hub, hf_env: Path) -> None:
    assert pull(SHARDED, token=TOKEN).is_dir()
    hub.revoke(TOKEN)
    with pytest.raises(TokenRejected) as e:
        pull(BIG, token=TOKEN)
    assert "revoked" in e.value.message and "shoal models login" in e.value.message
    _nothing_written(hf_env, BIG)


def test_not_enough_disk_space(hub, hf_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = download.shutil.disk_usage
    monkeypatch.setattr(download.shutil, "disk_usage",
                        lambda p: real(p)._replace(free=1_000_000))
    with pytest.raises(InsufficientDisk) as e:
        pull(BIG)
    assert "1.0 MB free" in e.value.message and "HF_HUB_CACHE" in e.value.message
    assert hub.served() == 0
    _nothing_written(hf_env, BIG)


@pytest.fixture
def small_disk(tmp_path: Path) -> Path:
    """A 2 MB tmpfs (root only; skipped elsewhere)."""
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"can't mount a small tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_really_small_disk(hub, small_disk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(small_disk / "hub"))
    with pytest.raises(InsufficientDisk) as e:
        pull(BIG)  # 8 MB of weights onto 2 MB
    assert "Free some space" in e.value.message
    _nothing_written(small_disk / "hub", BIG)
    assert pull(SHARDED).is_dir()  # a model that fits still does
    # a disk that fills up during the download (the check said yes): the same clean error
    real = download.shutil.disk_usage
    monkeypatch.setattr(download.shutil, "disk_usage",
                        lambda p: real(p)._replace(free=10**12))
    with pytest.raises(InsufficientDisk, match="is full"):
        pull(BIG)
    _nothing_written(small_disk / "hub", BIG)


def test_offline_mode_uses_the_cache_only(hub, hf_env: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    snap = pull(SHARDED)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.reset_counters()
    assert pull(SHARDED) == snap  # verified from the cache, the Hub never asked
    assert hub.requests == []
    with pytest.raises(HubOffline, match="HF_HUB_OFFLINE"):
        pull(BIG)
