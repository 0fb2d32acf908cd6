"""Starting a distributed instance's ranks (the owner's side of a launch).

Every node checks the model and hands out two fresh ports (MLX's ring or jaccl, and the
doorbell); then every rank starts at once from one DistConfig (MLX's init needs them all)
and the owner waits until each has loaded its share. The first rank to fail ends the
launch, and its error names the node it came from."""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar, cast

from engine.cluster.dist_config import DistConfig
from engine.cluster_records import FollowerState, RankPorts, RankPrepare, RankStart
from engine.errors import PeerUnreachable, ShoalError, WorkerFailed
from engine.node.launch import Instance, Rank, fresh_ports, host_of, write_config
from engine.node.peers import Peers
from engine.node.service import Node
from engine.records import ENDED, InstanceState, Record
from engine.runtime.prefix import default_budget

R = TypeVar("R", bound=Record)
WATCH_S = 2.0  # a follower's state is polled this often, and answers within twice it
LOAD_S = 900.0  # a follower loading its shard this long has failed


async def start_ranks(node: Node, peers: Peers, host: str, inst: Instance, path: Path,
                      context: int) -> None:
    """Start every rank of `inst` (rank 0 on `node`, reached at `host`; the others on
    their nodes) or raise."""
    preps = await asyncio.gather(*(
        _prepare_local(node, host, inst) if r.url is None else
        peer_record(RankPorts, peers, r.url, "POST", "/shoal/peer/prepare",
                    RankPrepare(inst.id, inst.model, host_of(r.url)), timeout=30)
        for r in inst.ranks), return_exceptions=True)
    for r, p in zip(inst.ranks, preps):
        if isinstance(p, BaseException):
            raise blame(r, p)
    got = cast(list[RankPorts], preps)  # no exceptions past this point
    base = DistConfig(
        rank=0, world=len(inst.ranks), backend=inst.backend,
        hosts=tuple(p.ring for p in got), bells=tuple(p.bell for p in got),
        strategy=inst.strategy,
        layers=tuple(r.layers for r in inst.ranks if r.layers)
        if inst.strategy == "pipeline" else (),
        timeout_s=120,  # one token or one 2048-token prefill chunk round the whole group
        devices=tuple(tuple(row) for row in inst.devices) if inst.devices else None,
        coordinator=got[0].ring if inst.devices else None,
        # the prefix cache budget every rank shares (the planner counts it)
        prefix_cache_tokens=default_budget(context), lanes=inst.lanes,
        kv_bits=inst.kv_bits,
        context_limit=node.model_settings.context_limit(inst.model),
        token=secrets.token_hex(16))
    owner = peers.url_of(f"{host}:{node.port}")

    async def follower(i: int, r: Rank) -> None:
        assert r.url is not None
        try:
            start = RankStart(inst.id, inst.model, owner, replace(base, rank=i))
            await peers.call(r.url, "POST", "/shoal/peer/start", start.to_json(), timeout=30)
        except Exception as e:
            raise blame(r, e) from e
        await _await_follower(peers, inst, i, r)

    async def rank0() -> None:
        try:
            await _start_rank0(node, inst, path, base)
        except Exception as e:
            raise blame(inst.ranks[0], e) from e

    # every rank at once (MLX's init needs them all); the first to fail ends the launch,
    # so a follower that dies while starting is reported at once, not after rank 0 has
    # waited its whole timeout for it
    await _first_failure([rank0(), *(follower(i, r) for i, r in enumerate(inst.ranks)
                                     if r.url is not None)])


async def _first_failure(coros: list[Any]) -> None:
    """Run `coros` together until all end; on the first that raises, cancel the rest
    and raise its error."""
    tasks = [asyncio.ensure_future(co) for co in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in tasks:
            if t in done and t.exception() is not None:
                raise cast(BaseException, t.exception())
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def follower_state(peers: Peers, url: str, inst_id: str) -> FollowerState:
    """A follower rank's state as its node reports it."""
    return await peer_record(FollowerState, peers, url, "GET",
                             f"/shoal/peer/instances/{inst_id}", timeout=WATCH_S * 2)


async def peer_record(cls: type[R], peers: Peers, url: str, method: str, path: str,
                      body: Record | dict[str, Any] | None = None,
                      timeout: float = 10.0) -> R:
    """A peer's answer as the record it should be; one this node can't read (another
    version's) is the peer's PeerUnreachable, saying so."""
    got = await peers.call(url, method, path,
                           body.to_json() if isinstance(body, Record) else body,
                           timeout=timeout)
    try:
        return cls.from_json(got)
    except (TypeError, ValueError, AttributeError) as e:
        raise PeerUnreachable(f"{url} answered {path} in a shape this node can't read "
                              f"({e}); update both nodes") from None


def blame(rank: Rank, e: BaseException) -> ShoalError:
    """`e` as an error that names the rank's node (a peer's 5xx is a 502 here)."""
    where = f"node {rank.node}"
    if isinstance(e, ShoalError):
        err = ShoalError(f"{where}: {e.message}", param=e.param, code=e.code, node=rank.node)
        err.status, err.type = (e.status if e.status < 500 else 502), e.type
        return err
    return PeerUnreachable(f"{where}: {e}", node=rank.node)


async def _prepare_local(node: Node, host: str, inst: Instance) -> RankPorts:
    node.resolve(inst.model)
    return fresh_ports(host)


async def _start_rank0(node: Node, inst: Instance, path: Path, cfg: DistConfig) -> None:
    w = await node.start_worker(inst.model, path,
                                dist_config=write_config(node.home, inst.id, cfg))
    if w.ready is not None and w.ready.rank is not None:
        inst.ranks[0].loaded = w.ready.rank.report()


async def _await_follower(peers: Peers, inst: Instance, i: int, r: Rank,
                          timeout: float = LOAD_S) -> None:
    assert r.url is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = await follower_state(peers, r.url, inst.id)
        r.progress = st.progress  # shown per rank while the instance starts
        if st.state == InstanceState.READY:
            r.loaded = st.loaded
            return
        if st.state in ENDED:
            raise WorkerFailed(f"rank {i} on node {r.node} failed: {st.reason}", node=r.node)
        await asyncio.sleep(0.2)
    raise WorkerFailed(f"rank {i} on node {r.node} did not load within {timeout:.0f} s",
                       node=r.node)
