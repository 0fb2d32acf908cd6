"""The app's settings that live in the node's home, through the node: the cluster secret
(show, rotate) and the Hugging Face token. Only for clients on this machine, and POSTs,
so no web page may ask (engine.api.cors refuses control routes to pages)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from engine.errors import BadRequest
from engine.node.incoming import json_object, require_local

routes = web.RouteTableDef()


def secret_report(rotate: bool, home: Any) -> dict[str, str]:
    """{"secret", "pairing", "where"}, after storing a new secret when `rotate` (the node
    uses it from its next start, as with `shoal secret rotate`)."""
    from engine.cluster.auth import pairing_code
    from engine.cluster.secret import SecretStore, new_secret
    store = SecretStore(home)
    if rotate:
        store.set(new_secret())
    value = store.ensure()
    return {"secret": value, "pairing": pairing_code(value), "where": store.where}


@routes.post("/shoal/settings/secret")
async def cluster_secret(request: web.Request) -> web.Response:
    """{"rotate"?: true} → the cluster secret, its pairing code and where it is kept."""
    require_local(request, "read the cluster secret")
    body = await json_object(request, 'Send {} or {"rotate": true}.', "rotate")
    found = await asyncio.to_thread(secret_report, bool(body.get("rotate")),
                                    request.app["node"].home)
    return web.json_response(found)


@routes.post("/shoal/settings/hf-token")
async def hf_token(request: web.Request) -> web.Response:
    """{"token"} → checked with the Hub (where it can be reached) and stored; {"message"}."""
    from engine.hub.cli_models import store_token
    from engine.hub.token import TokenStore
    require_local(request, "store a Hugging Face token")
    usage = 'Send {"token": "hf_..."}.'
    body = await json_object(request, usage, "token")
    if not isinstance(body.get("token"), str):
        raise BadRequest(usage, param="token")
    store = TokenStore(request.app["node"].home)
    message = await asyncio.to_thread(store_token, store, body["token"])
    return web.json_response({"message": message})
