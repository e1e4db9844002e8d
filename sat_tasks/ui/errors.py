"""How the view's pages answer a refusal: a login redirect for no login, a not-found page, the JSON API unchanged.

A page (a GET outside `/api/`) that Airflow's dependencies refuse for want of a login (401)
redirects to the auth manager's login page, which comes back to it afterwards; a page whose
run or route does not exist (a deleted run, a stale link) answers 404 with a page in the
view's style that says so and links to the list. Everything else (the JSON API, forms,
403s) keeps FastAPI's JSON answer, which the REST clients read.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from sat_tasks.ui.templating import render


def is_page(request: Request) -> bool:
    """Whether the request asks for one of the view's pages (a GET outside the JSON API), not for JSON."""
    path = request.url.path.removeprefix(request.scope.get("root_path", "") or "")
    return request.method in ("GET", "HEAD") and not path.startswith(("/api/", "/openapi.json"))


def login_url(request: Request) -> str:
    """The auth manager's login page, with this page to come back to."""
    from airflow.api_fastapi.app import get_auth_manager

    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return get_auth_manager().get_url_login(next_url=here)


async def answer_refusal(request: Request, exc: StarletteHTTPException) -> Response:
    """The app's HTTPException handler: pages get a login redirect (401) or a not-found page (404)."""
    if is_page(request) and exc.status_code == 401:
        return RedirectResponse(login_url(request), status_code=303)
    if is_page(request) and exc.status_code == 404:
        detail = exc.detail if isinstance(exc.detail, str) and exc.detail != "Not Found" else None
        return HTMLResponse(render("not_found.html", detail=detail), status_code=404)
    return await http_exception_handler(request, exc)


def install(app: FastAPI) -> None:
    """Answer the app's pages' refusals as pages (`answer_refusal`)."""
    app.add_exception_handler(StarletteHTTPException, answer_refusal)
