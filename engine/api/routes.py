"""Every protocol's routes, for the node's HTTP server: one adapter module per protocol."""

from __future__ import annotations

from aiohttp import web

from engine.api import openai_chat

routes: list[web.RouteDef] = [*openai_chat.routes]  # type: ignore[list-item]
