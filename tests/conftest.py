"""Shared fixtures: tiny models and real node processes (see nodes.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Test nodes never multicast on the machine's real network; mDNS tests opt in, inside
# network namespaces of their own.
os.environ["SHOAL_MDNS"] = "off"
os.environ["SHOAL_CLUSTER_HOST"] = "127.0.0.1"  # and open no port beyond loopback
os.environ["SHOAL_CALIBRATE"] = "0"  # a second of full CPU per node start; tests opt in
# Nodes serve on MLX, which the suite's exact comparisons are about; the llama.cpp engine's
# tests opt in (tests/engine/runtime/test_llamacpp_engine.py)
os.environ["SHOAL_CPU_ENGINE"] = "mlx"
# Those comparisons are bit for bit across batch shapes (one request alone against the same
# in a batch, a group against one process). The gemv shim rounds products of 1 to 4 rows
# differently from gemm's, which can flip a near-tie of a tiny random model, so nodes run
# without it; tests/engine/platform/test_gemv_shim.py runs it, in MLX and in a real node.
os.environ["SHOAL_GEMV"] = "0"
sys.path.insert(0, str(Path(__file__).parent))
from nodes import NodeProcess, home_with  # noqa: E402
from tiny import make_tiny_model  # noqa: E402

# What `scripts/test --fast` leaves out: the bundle and wheel builds (packaging) and the
# tests that start groups of processes or whole clusters (slow). CI runs everything.
SLOW_PATHS = ("tests/cluster/", "tests/engine/runtime/test_distributed.py",
              "tests/engine/runtime/test_pipeline_lanes.py",
              "tests/engine/runtime/test_real_checkpoints_groups.py",
              "tests/engine/api/test_agents_e2e.py", "tests/engine/api/test_openapi_fuzz.py")


# What scripts/test runs one at a time, beside the rest (niced, two files at a time):
# tests whose assertion is about timing, which a neighbour's load can stretch (a dead
# peer noticed within seconds, a cable pulled under load, healing, mDNS in network
# namespaces). They mostly wait on timeouts, so the niced rest doesn't delay them. The
# other cluster tests use free ports and mDNS is off, so they share the machine too.
ALONE_PATHS = ("tests/cluster/test_distributed_nodes.py", "tests/cluster/test_faults_under_load.py",
               "tests/cluster/test_healing.py", "tests/cluster/test_healing_hand_split.py",
               "tests/cluster/test_link_cut_under_load.py", "tests/cluster/test_links.py",
               "tests/cluster/test_mdns_netns.py")
# What it runs last, alone on the machine: tests about throughput under their own load,
# which any other work, niced or not, stretches (test_long_prefill's 1 s prefill chunks
# against a 3 s stall watchdog took over 3 s beside the niced rest; test_batching's
# concurrent streams were once seen one at a time beside other tests).
# test_connection_flood times chats under a flood of 2,200 sockets, whose client ends take
# as many of the machine's ephemeral ports: beside other tests a port one of them had
# found free and was about to bind was taken (seen once, a group's rank failing to listen).
# test_prefill_resume compares a retry's first token with a cold one's (a ratio), which a
# neighbour's load skews.
LAST_PATHS = ("tests/engine/api/test_batching.py", "tests/engine/api/test_long_prefill.py",
              "tests/engine/api/test_prefill_resume.py",
              "tests/engine/node/test_connection_flood.py")

# The longest files of the shared phase, longest first (the durations of a whole run):
# started first, they don't leave one worker running them while the other waits.
LONGEST_FIRST = ("tests/packaging/test_linux_bundle.py",
                 "tests/engine/runtime/test_distributed.py",
                 "tests/engine/runtime/test_real_checkpoints_groups.py",
                 "tests/cluster/test_family_matrix.py",
                 "tests/engine/api/test_openapi_fuzz.py")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--phase", choices=("shared", "alone", "last"), default=None,
                     help="scripts/test's phases: the tests that may share the machine, "
                          "those run one at a time beside them (ALONE_PATHS in "
                          "tests/conftest.py), and those run alone after both (LAST_PATHS)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).resolve().parent.parent
    phase = config.getoption("--phase")
    keep, drop, order = [], [], {}
    for item in items:
        where = Path(str(item.fspath)).resolve().relative_to(root).as_posix()
        order[item.nodeid] = LONGEST_FIRST.index(where) if where in LONGEST_FIRST \
            else len(LONGEST_FIRST)
        if where.startswith("tests/packaging/"):
            item.add_marker(pytest.mark.packaging)
        elif where.startswith(SLOW_PATHS):
            item.add_marker(pytest.mark.slow)
        mine = "last" if where.startswith(LAST_PATHS) else \
            "alone" if where.startswith(ALONE_PATHS) else "shared"
        (drop if phase and mine != phase else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    if phase == "shared":  # stable: the rest keep their order
        items.sort(key=lambda item: order[item.nodeid])


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_node(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
              ) -> Iterator[NodeProcess]:
    """One node serving tiny-llama for the whole session (read-only tests share it)."""
    home = home_with(tmp_path_factory.mktemp("tiny-node"), tiny_model_dir)
    node = NodeProcess(home, "tiny-llama").wait_healthy()
    try:
        node.wait_ready()
        yield node
    finally:
        node.stop()


@pytest.fixture
def fresh_node(tmp_path: Path, tiny_model_dir: Path) -> Iterator[NodeProcess]:
    """A node of this test's own, for tests that break things (kill workers, ...)."""
    node = NodeProcess(home_with(tmp_path, tiny_model_dir), "tiny-llama").wait_healthy()
    try:
        node.wait_ready()
        yield node
    finally:
        node.stop()


