"""The pieces of a distributed worker that need no second process: the group config and
the files MLX reads, the request header, the pipeline stage adapter for every family it
claims, and which weights a pipeline rank reads."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from engine.cluster.dist_config import BadDistConfig, DistConfig, check_layer_ranges
from engine.errors import ModelNotFound, ShardMismatch
from engine.runtime.group.distributed import Watchdog, mlx_environment
from engine.runtime.group.lockstep import Header, prefill_chunks
from engine.runtime.sampling import Sampling
from tiny import LLAMA, make_tiny_model  # noqa: E402

CONFIG = {"rank": 1, "world": 3, "backend": "ring", "strategy": "pipeline",
          "hosts": ["127.0.0.1:5000", "127.0.0.1:5001", "127.0.0.1:5002"],
          "bells": ["127.0.0.1:6000", "127.0.0.1:6001", "127.0.0.1:6002"],
          "layers": [[0, 3], [3, 4], [4, 6]], "timeout_s": 7}


def test_ring_config_becomes_mlx_hostfile_and_rank(tmp_path):
    cfg = DistConfig.from_json(CONFIG)
    assert (cfg.predecessor, cfg.successor) == (0, 2)
    env = mlx_environment(cfg, tmp_path)
    assert env["MLX_RANK"] == "1"
    assert json.loads(Path(env["MLX_HOSTFILE"]).read_text()) == [[h] for h in CONFIG["hosts"]]


@pytest.mark.parametrize("backend,ring", [("jaccl", False), ("jaccl-ring", True)])
def test_jaccl_config_writes_device_matrix_and_coordinator(tmp_path, backend, ring):
    devices = [[None, "rdma_en3", "rdma_en4"], ["rdma_en3", None, "rdma_en5"],
               ["rdma_en4", "rdma_en5", None]]
    cfg = DistConfig.from_json({**CONFIG, "backend": backend, "devices": devices,
                                "coordinator": "10.0.0.1:7000"})
    env = mlx_environment(cfg, tmp_path)
    assert json.loads(Path(env["MLX_IBV_DEVICES"]).read_text()) == devices
    assert env["MLX_JACCL_COORDINATOR"] == "10.0.0.1:7000" and env["MLX_RANK"] == "1"
    assert ("MLX_JACCL_RING" in env) is ring
    with pytest.raises(BadDistConfig):  # a rank's own cell must be null
        DistConfig.from_json({**CONFIG, "backend": backend, "coordinator": "10.0.0.1:7000",
                              "devices": [["x"] * 3] * 3})


@pytest.mark.parametrize("change", [
    {"rank": 3}, {"world": 1, "rank": 0}, {"bells": ["127.0.0.1:1"]}, {"hosts": ["nope"] * 3},
    {"strategy": "magic"}, {"layers": [[0, 3], [4, 6], [6, 7]]}, {"layers": [[0, 3], [3, 3],
                                                                           [3, 6]]},
])
def test_bad_configs_are_refused_with_a_reason(change):
    with pytest.raises(BadDistConfig) as e:
        DistConfig.from_json({**CONFIG, **change})
    assert e.value.message


def test_layer_ranges_must_cover_the_model():
    check_layer_ranges(((0, 3), (3, 6)), 2, 6)
    with pytest.raises(BadDistConfig):
        check_layer_ranges(((0, 3), (3, 5)), 2, 6)


def test_header_round_trip():
    s = Sampling(max_tokens=77, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05,
                 repetition_penalty=1.2, seed=2**62 + 12345)
    h = Header(513, 576, "bfloat16", s)
    assert Header.decode(h.encode()) == Header(513, 576, "bfloat16", Sampling(
        max_tokens=77, temperature=pytest.approx(0.7), top_p=pytest.approx(0.9), top_k=40,
        min_p=pytest.approx(0.05), repetition_penalty=pytest.approx(1.2), seed=2**62 + 12345))
    plain = Header.decode(Header(5, 64, "float32", Sampling()).encode()).sampling
    assert plain.repetition_penalty is None and plain.seed is None


def test_prefill_chunks_follow_mlx_lm():
    assert prefill_chunks(1) == []
    assert prefill_chunks(7) == [6]
    assert prefill_chunks(4100, 2048) == [2048, 2048, 3]


def test_watchdog_fires_only_when_a_watched_wait_overruns():
    fired = threading.Event()
    dog = Watchdog(0.3, lambda what, peer: fired.set())
    with dog.watch("a quick step", 1):
        pass
    assert not fired.wait(0.6)
    with dog.watch("a stuck step", 1):
        assert fired.wait(3)


# -- which weights a pipeline rank reads --------------------------------------------------
def split_into_files(folder: Path) -> None:
    """Rewrite a one-file model as three files and an index, like a Hub checkpoint."""
    import mlx.core as mx

    weights = mx.load(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    parts = {"model-1.safetensors": lambda k: "layers" not in k or ".layers.0." in k
             or ".layers.1." in k,
             "model-2.safetensors": lambda k: any(f".layers.{i}." in k for i in (2, 3)),
             "model-3.safetensors": lambda k: any(f".layers.{i}." in k for i in (4, 5))}
    wmap = {}
    for name, want in parts.items():
        part = {k: v for k, v in weights.items() if want(k)}
        mx.save_safetensors(str(folder / name), part)
        wmap.update({k: name for k in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wmap}))


def test_a_middle_rank_reads_only_its_layers(tmp_path):
    from engine.runtime.shard_load import load_pipeline_stage

    folder = make_tiny_model(tmp_path / "m", LLAMA, num_hidden_layers=6, hidden_size=256,
                             intermediate_size=1024)
    split_into_files(folder)
    whole = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    stage, _, info = load_pipeline_stage(folder, 2, 4)
    assert info.files == ("model-2.safetensors",)
    assert (folder / "model-2.safetensors").stat().st_size * 0.9 < info.bytes_read < whole / 2
    assert len(stage.layers) == 2
    assert type(stage.model.model.embed_tokens).__name__ == "ZeroEmbed"
    # The last rank holds no head either: rank 0 runs it.
    _, _, info = load_pipeline_stage(folder, 4, 6)
    assert info.files == ("model-3.safetensors",)
    (folder / "model-3.safetensors").unlink()  # a rank needs only the files it uses
    load_pipeline_stage(folder, 2, 4)
    with pytest.raises(ModelNotFound, match="model-3"):  # gone: named, not guessed
        load_pipeline_stage(folder, 4, 6)


def test_missing_layers_in_the_checkpoint_are_named():
    from engine.hub.shards import files_for_layers

    wmap = {"model.layers.0.mlp.weight": "a", "model.layers.2.mlp.weight": "b",
            "model.norm.weight": "b"}
    assert files_for_layers(wmap, (2, 3), 3, first=True) == {"b"}
    assert files_for_layers(wmap, (0, 1), 3, first=False) == {"a"}
    with pytest.raises(ValueError, match=r"\[1\]"):
        files_for_layers(wmap, (0, 3), 3, first=False)


def test_tensor_split_needs_heads_divisible():
    from engine.runtime.shard_load import check_tensor_split

    check_tensor_split({"num_attention_heads": 8, "num_key_value_heads": 2}, 2)
    with pytest.raises(ShardMismatch, match="divide by 3"):
        check_tensor_split({"num_attention_heads": 8, "num_key_value_heads": 2}, 3)
    with pytest.raises(ShardMismatch):
        check_tensor_split({"num_attention_heads": 8, "num_key_value_heads": 2}, 4)


def test_unreadable_config_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "rank.json"
    bad.write_text("{not json")
    with pytest.raises(BadDistConfig, match="rank.json"):
        DistConfig.from_file(bad)
    bad.write_text(json.dumps(CONFIG))
    assert DistConfig.from_file(bad).rank == 1


@pytest.mark.skipif(sys.platform != "linux", reason="reads Linux's TCP options back")
def test_doorbell_sockets_watch_their_path(monkeypatch, caplog):
    """Keepalive and a bound on unacknowledged data are set; an option the OS refuses is
    logged, not fatal (the group's watchdog still bounds every wait)."""
    import socket

    from engine.runtime.group.doorbell import DEAD_PATH_S, watch_path

    with socket.create_server(("127.0.0.1", 0)) as srv, \
            socket.create_connection(srv.getsockname()) as s:
        watch_path(s)
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        idle = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
        intvl = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL)
        count = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)
        assert idle + intvl * count <= DEAD_PATH_S
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == DEAD_PATH_S * 1000
        monkeypatch.setattr(socket, "TCP_KEEPCNT", 12345)  # an option this OS lacks
        watch_path(s)
        assert "not set" in caplog.text


def test_a_doorbell_waits_for_a_busy_neighbours_answer():
    """A neighbour that reads the hello but answers late (a loaded machine) counts the
    connection as made: the ringing rank must wait for its answer, not give up after 2 s
    and ring again on a connection the neighbour no longer accepts (the group then never
    formed, and said the neighbour 'belongs to another group'). A real listener stands in
    for the neighbour, so the wait can be scripted."""
    import socket
    import time

    from engine.runtime.group.doorbell import _HELLO_LEN, Doorbell

    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        cfg = DistConfig.from_json({**CONFIG, "rank": 0, "world": 2, "hosts": CONFIG["hosts"][:2],
                                    "layers": [[0, 3], [3, 6]], "timeout_s": 10,
                                    "bells": ["127.0.0.1:1", f"127.0.0.1:{port}"]})
        seen: list[int] = []

        def neighbour() -> None:
            s, _ = srv.accept()
            got = b""
            while len(got) < _HELLO_LEN:
                got += s.recv(_HELLO_LEN)
            seen.append(1)
            time.sleep(2.5)  # busy: past the connect timeout
            s.sendall(b"K")
            time.sleep(0.5)
            s.close()

        t = threading.Thread(target=neighbour, daemon=True)
        t.start()
        bell = Doorbell(cfg, on_lost=lambda *a: None, on_quit=lambda p: None)
        start = time.monotonic()
        s = bell._connect(time.monotonic() + cfg.timeout_s)
        took = time.monotonic() - start
        s.close()
        t.join(5)
    assert seen == [1], "the neighbour was rung once, not again"
    assert 2.4 < took < 5


def test_a_doorbell_whose_neighbour_never_comes_gives_up_at_its_timeout():
    """No process start in the timing (the group test can't leave it out): the ring is
    opened in this process, to a neighbour's address nobody listens on."""
    import socket
    import time

    from engine.errors import PeerUnreachable
    from engine.runtime.group.doorbell import Doorbell

    with socket.socket() as a, socket.socket() as b:  # two free ports, then closed
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        mine, theirs = (f"127.0.0.1:{s.getsockname()[1]}" for s in (a, b))
    cfg = DistConfig.from_json({**CONFIG, "rank": 0, "world": 2, "hosts": CONFIG["hosts"][:2],
                                "layers": [[0, 3], [3, 6]], "timeout_s": 2,
                                "bells": [mine, theirs]})
    bell = Doorbell(cfg, on_lost=lambda *a: None, on_quit=lambda p: None)
    start = time.monotonic()
    with pytest.raises(PeerUnreachable) as e:
        bell.open()
    took = time.monotonic() - start
    assert 1.9 < took < 4, took
    assert "rank 1" in e.value.message and theirs in e.value.message
    assert "within 2 s" in e.value.message


def test_a_doorbell_admits_only_a_rank_of_its_own_group():
    """Anyone on the network can connect to a rank's doorbell port. One who knows the
    group's addresses, layers and ports but not the token its owner handed out over the
    cluster's TLS is turned away ('X'); the real predecessor still gets in."""
    import socket
    import time

    from engine.errors import PeerUnreachable
    from engine.runtime.group.doorbell import Doorbell

    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        bells = [f"127.0.0.1:{s.getsockname()[1]}" for s in (a, b)]
    shape = {**CONFIG, "world": 2, "hosts": CONFIG["hosts"][:2], "layers": [[0, 3], [3, 6]],
             "timeout_s": 10, "bells": bells, "token": "f00d" * 8}
    cfgs = [DistConfig.from_json({**shape, "rank": r}) for r in (0, 1)]
    guess = DistConfig.from_json({**shape, "rank": 0, "token": ""})
    assert guess.group_id != cfgs[0].group_id
    bells_open = [Doorbell(c, on_lost=lambda *a: None, on_quit=lambda p: None)
                  for c in cfgs]
    t = threading.Thread(target=bells_open[1].open, daemon=True)
    t.start()
    stranger = Doorbell(guess, on_lost=lambda *a: None, on_quit=lambda p: None)
    with pytest.raises(PeerUnreachable) as refused:
        stranger._connect(time.monotonic() + 1.5)
    assert "another group" in refused.value.message, refused.value.message
    bells_open[0].open()  # the real rank 0 rings rank 1, and rank 1 rings it back
    t.join(10)
    assert not t.is_alive()
    for bell in bells_open:
        bell.quit()
