"""The plugin's app: built on the first request only, and loading the plugin's module imports no web framework."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from sat_tasks.ui.lazy import LazyApp

BUILT: list[str] = []


def build_app():
    """A factory the test names by path, as the plugin names `sat_tasks.ui.app:create_app`."""
    async def app(scope, receive, send):
        await send({"path": scope["path"]})

    BUILT.append("app")
    return app


def test_the_app_is_built_on_the_first_request_and_only_then():
    lazy = LazyApp(f"{__name__}:build_app")
    assert BUILT == []
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def requests():
        for path in ("/jobs", "/workspaces"):
            await lazy({"path": path}, None, send)

    asyncio.run(requests())
    assert BUILT == ["app"] and sent == [{"path": "/jobs"}, {"path": "/workspaces"}]


def test_loading_the_lazy_app_imports_neither_fastapi_nor_the_view():
    """Every Airflow process loads the plugin: it must not pay for the API server's modules."""
    code = ("import sys, sat_tasks.ui.lazy; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fastapi', 'starlette', 'jinja2')"
            " or m.startswith(('sat_tasks.ui.app', 'sat_tasks.ui.routers', 'airflow.api_fastapi'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
