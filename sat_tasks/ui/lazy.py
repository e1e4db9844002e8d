"""`LazyApp`: the plugin's ASGI app, built on its first request, so loading the plugin imports almost nothing."""

from __future__ import annotations

import importlib
from typing import Any


class LazyApp:
    """An ASGI app that builds the app `factory` names (`"module:function"`) on its first request.

    Every Airflow process that loads plugins (task processes too) imports the plugin module;
    building the FastAPI app there would import the API server's modules (~2 s) into each
    task. Only the API server ever calls it; the view's modules import what they need at
    their top, because only then are they imported.
    """

    def __init__(self, factory: str) -> None:
        self._factory = factory
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            module, _, name = self._factory.partition(":")
            self._app = getattr(importlib.import_module(module), name)()
        await self._app(scope, receive, send)
