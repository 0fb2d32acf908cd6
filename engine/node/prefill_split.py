"""Before a request runs: where the instance has a prefill node and the prompt is long
enough to pay, its KV comes from there, into a model served alone
(engine/node/handover.py) or into every rank of a group (engine/node/handover_group.py)."""

from __future__ import annotations

from typing import Any

from engine import protocol as wire
from engine.node import handover, handover_group


async def before_generate(node: Any, cluster: Any, worker: Any,
                          req: wire.GenerateRequest) -> None:
    chosen = await handover.decide(node, cluster, worker, req)
    if chosen is None:
        return
    peer, tokens = chosen
    if worker.dist_config is not None:
        await handover_group.into_group(node, cluster, worker, peer, tokens)
    else:
        await handover.into_one(node, cluster, worker, peer, tokens)
