"""forge ui: a read-only web app over the run store (FastAPI; `forge ui` serves it with uvicorn).

Pages: the run list, a run page (the report's tables and charts, linked to tasks) and a task page whose
tree (drawn by static/forge.js) opens a node's code, diff, logs, timing and LLM text on click. Pages of a
running run poll a small JSON version endpoint and refresh themselves when it changes.

Important: only GET routes exist; every store value is escaped on the server (html.py) or set as text by
the script; the Content-Security-Policy allows scripts from this app only, so nothing is fetched elsewhere.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles

from forge.review import compare, html, source
from forge.review.data import (
    find_run,
    list_summaries,
    node_detail,
    run_view,
    summarize,
    task_view,
)
from forge.review.jsonviews import node_json, runs_json, tree_json
from forge.review.report import report_json
from forge.store import RunRecord, Store, TaskRecord

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def _live_attrs(version_url: str, fragment_url: str, version: str, running: bool) -> dict[str, str]:
    return {"data-poll": version_url, "data-fragment": fragment_url, "data-version": version,
            "data-running": "1" if running else "0"}


def create_app(store: Store) -> FastAPI:
    """The app over one store; it only reads."""
    app = FastAPI(title="forge ui", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    _add_headers_and_errors(app)
    _add_api_routes(app, store)
    _add_fragment_routes(app, store)
    _add_page_routes(app, store)
    _add_compare_route(app, store)
    return app


def _runs_version(runs: list[RunRecord]) -> tuple[str, bool]:
    """The run list's version for the page to poll, and whether any run is still running."""
    return ";".join(f"{r.id}:{r.state}:{r.forge_ms}" for r in runs), any(r.state == "running" for r in runs)


def _run_task(store: Store, run_id: str, task_id: int) -> tuple[RunRecord, TaskRecord]:
    """The run and one of its tasks; KeyError (a 404) if either is unknown or the task is another run's."""
    run, task = find_run(store, run_id), store.get_task(task_id)
    if task.run_id != run.id:
        raise KeyError(f"task {task_id} is not in run {run.id}")
    return run, task


def _add_headers_and_errors(app: FastAPI) -> None:
    """The security headers on every response, KeyError as a 404 (JSON under /api/) and an empty favicon."""

    @app.middleware("http")
    async def headers(request: Request, call_next: Any) -> Response:
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        return response

    @app.exception_handler(KeyError)
    async def not_found(request: Request, exc: KeyError) -> Response:
        message = str(exc.args[0]) if exc.args else "not found"
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": message}, status_code=404)
        return PlainTextResponse(message, status_code=404)

    @app.get("/favicon.ico")
    def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/highlight.css")
    def highlight_css() -> Response:
        return Response(source.stylesheet(), media_type="text/css")


def _add_api_routes(app: FastAPI, store: Store) -> None:
    """The JSON routes under /api/: runs, a run's report, a task's tree, a node in full."""

    @app.get("/api/runs")
    def api_runs() -> dict[str, Any]:
        runs = store.list_runs()
        version, running = _runs_version(runs)
        return {"version": version, "running": running, "runs": runs_json([summarize(store, r) for r in runs])}

    @app.get("/api/runs/{run_id}")
    def api_run(run_id: str) -> dict[str, Any]:
        view = run_view(store, find_run(store, run_id))
        return {**report_json(view), "version": view.version()}

    @app.get("/api/runs/{run_id}/tasks/{task_id}")
    def api_task(run_id: str, task_id: int) -> dict[str, Any]:
        run, task = _run_task(store, run_id, task_id)
        return tree_json(task_view(store, task), run.state)

    @app.get("/api/nodes/{node_id}")
    def api_node(node_id: int) -> dict[str, Any]:
        return node_json(node_detail(store, node_id))


def _add_fragment_routes(app: FastAPI, store: Store) -> None:
    """The HTML fragments under /fragments/ (escaped on the server; the page script swaps them in)."""

    @app.get("/fragments/runs", response_class=HTMLResponse)
    def frag_runs() -> str:
        return html.runs_table(list_summaries(store))

    @app.get("/fragments/runs/{run_id}", response_class=HTMLResponse)
    def frag_run(run_id: str) -> str:
        return html.run_sections(run_view(store, find_run(store, run_id)), link=True)

    @app.get("/fragments/runs/{run_id}/tasks/{task_id}/nodes", response_class=HTMLResponse)
    def frag_nodes(run_id: str, task_id: int) -> str:
        return html.nodes_table(task_view(store, _run_task(store, run_id, task_id)[1]))

    @app.get("/fragments/nodes/{node_id}", response_class=HTMLResponse)
    def frag_node(node_id: int) -> str:
        return html.node_panel(node_detail(store, node_id))


def _add_page_routes(app: FastAPI, store: Store) -> None:
    """The pages: the run list, a run and a task."""
    scripts = ["/static/forge.js"]

    @app.get("/", response_class=HTMLResponse)
    def page_runs() -> str:
        runs = store.list_runs()
        version, running = _runs_version(runs)
        return html.page("runs_page.html", "forge runs", inline_css=False, scripts=scripts,
                         body_attrs=_live_attrs("/api/runs", "/fragments/runs", version, running),
                         table=html.runs_table([summarize(store, r) for r in runs]))

    @app.get("/runs/{run_id}", response_class=HTMLResponse)
    def page_run(run_id: str) -> str:
        view = run_view(store, find_run(store, run_id))
        rid = view.run.id
        others = [r.id for r in store.list_runs() if r.model == view.run.model and r.id != rid]
        attrs = _live_attrs(f"/api/runs/{rid}", f"/fragments/runs/{rid}", view.version(), view.run.state == "running")
        return html.page("run_page.html", f"forge run {rid}", inline_css=False, scripts=scripts, body_attrs=attrs,
                         rid=rid, others=others, sections=html.run_sections(view, link=True))

    @app.get("/runs/{run_id}/tasks/{task_id}", response_class=HTMLResponse)
    def page_task(run_id: str, task_id: int) -> str:
        run, task = _run_task(store, run_id, task_id)
        view = task_view(store, task)
        attrs = {"data-tree": f"/api/runs/{run.id}/tasks/{task.id}",
                 "data-nodes": f"/fragments/runs/{run.id}/tasks/{task.id}/nodes",
                 "data-running": "1" if run.state == "running" else "0"}
        return html.page("task_page.html", f"forge task {task.key}", inline_css=False, scripts=scripts,
                         body_attrs=attrs, run=run, task=task, summary=html.task_summary(view),
                         nodes=html.nodes_table(view), speedup=summarize(store, run).speedup)


def _add_compare_route(app: FastAPI, store: Store) -> None:
    """Two runs side by side: /compare?a=RUN&b=RUN."""

    @app.get("/compare", response_class=HTMLResponse)
    def page_compare(a: str = Query(...), b: str = Query(...)) -> str:
        left, right = (run_view(store, find_run(store, ref)) for ref in (a, b))
        return compare.compare_page(left, right, inline_css=False, scripts=["/static/forge.js"])
