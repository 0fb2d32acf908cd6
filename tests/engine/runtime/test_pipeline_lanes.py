"""A pipeline's lanes never wait in a circle, even where a send waits for its receiver.

MLX's jaccl (RDMA) send completes only once the receiving rank has posted its receive.
Over the ring backend (TCP) a send completes as soon as the kernel holds the bytes, so on
plain loopback a circle of waits can't show. Here the ranks run in a network namespace
whose TCP buffers are 4 KB: a send of a hidden state (4-16 KB for this model) then blocks
until the peer reads, as over RDMA, and a circle of waits turns into a watchdog failure.
(Checked: letting rank 0 keep one more item in flight than engine/runtime/group/batch.py
allows fails the 2-rank case.) Root and iproute2 only; skipped with the reason elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from dist_harness import (  # noqa: E402
    Group,
    Worker,
    collect_all,
    generate,
    overlapped_steps,
    send_all,
    texts,
)

from tiny import QWEN3, make_tiny_model  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="ring over loopback, Linux CI")

REQUESTS = [([{"role": "user", "content": f"Tell story number {i} about the sea."}],
             {"max_tokens": 20}) for i in range(3)]
REQUESTS.append(([{"role": "user", "content": "The lighthouse log, day by day. " * 12}],
                 {"max_tokens": 8}))  # a prompt long enough to be prefilled in chunks
SPLITS = {2: [[0, 2], [2, 4]], 3: [[0, 1], [1, 3], [3, 4]]}


@pytest.fixture(scope="module")
def small_buffers() -> list[str]:
    """`ip netns exec NS`: a namespace with loopback up and 4 KB TCP buffers."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to make a network namespace")
    ns = f"shoal-lanes-{uuid.uuid4().hex[:6]}"
    try:
        for cmd in (["ip", "netns", "add", ns],
                    ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
                    ["ip", "netns", "exec", ns, "sysctl", "-w",
                     "net.ipv4.tcp_rmem=4096 4096 4096", "net.ipv4.tcp_wmem=4096 4096 4096"]):
            subprocess.run(cmd, check=True, capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as e:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
        pytest.skip(f"can't make a namespace with small TCP buffers here ({e})")
    yield ["ip", "netns", "exec", ns]
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[str]]]:
    """A model whose hidden states outgrow the buffers, and its one-process answers."""
    root = tmp_path_factory.mktemp("lanes")
    model = make_tiny_model(root / "wide", QWEN3, seed=2, hidden_size=1024)
    w = Worker(["--model", str(model), "--model-id", "m"], root / "single.log")
    try:
        w.expect(lambda e: e["ev"] == "ready")
        return model, [texts(generate(w, f"ref{i}", m, **s))
                       for i, (m, s) in enumerate(REQUESTS)]
    finally:
        w.kill()


@pytest.mark.parametrize("world,lanes", [(2, 2), (3, 3), (2, 1)])
def test_lanes_finish_where_sends_wait_for_the_receiver(small_buffers, wide, tmp_path,
                                                        world, lanes):
    model, reference = wide
    group = Group(tmp_path, model, world, "pipeline", SPLITS[world], timeout_s=10,
                  streams=4, lanes=lanes, prefix=small_buffers)
    try:
        group.ready()
        t0 = time.monotonic()
        send_all(group.leader, REQUESTS, "c")
        got = collect_all(group.leader, [f"c{i}" for i in range(len(REQUESTS))], 30)
        assert [texts(got[f"c{i}"]) for i in range(len(REQUESTS))] == reference
        assert time.monotonic() - t0 < 10, "no wait ran into the watchdog"
        assert (overlapped_steps(group.leader) > 0) == (lanes > 1)
        assert group.shutdown() == [0] * world
    finally:
        group.kill()
