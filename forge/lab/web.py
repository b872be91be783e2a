"""forge lab's web app (FastAPI; `forge lab` serves it with uvicorn): the gallery by family, a page per kernel
(the catalogue's, and each kernel the user's runs found), and POST routes that run a kernel on the page's
settings and answer its pictures and numbers as JSON.

Important: forge kernels (generated or found) run in the evaluator's sandboxed worker, never in this process;
what runs here is trusted PyTorch code: a task's eager reference and the catalogue's vendor-path functions
(forge.lab.service says why). Bad input (an absurd size, a file that is not an image) is a 400 with a one-line
message and the server goes on; the Content-Security-Policy allows this app's own script only, and pictures are
data URIs.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.concurrency import run_in_threadpool

from forge.lab.catalogue import TITLES, catalogue, entry
from forge.lab.found import Found, picture
from forge.lab.inputs import parse_range, parse_settings, read_image
from forge.lab.pictures import draw
from forge.lab.service import Lab
from forge.lab.testimage import source as image_source

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
MAX_BODY = 12 << 20  # bytes of a run request (an image as base64)
_env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))


def _page(name: str, **kw: Any) -> str:
    return _env.get_template(name).render(**kw)


def create_app(lab: Lab, found: list[Found] | None = None) -> FastAPI:
    """The lab's app over one Lab; `found`: the store's kernels (forge.lab.found), each with a page."""
    app = FastAPI(title="forge lab", docs_url=None, redoc_url=None, openapi_url=None)
    by_slug = {f.slug: f for f in found or []}
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    @app.middleware("http")
    async def headers(request: Request, call_next: Any) -> Response:
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        return response

    @app.exception_handler(KeyError)
    async def not_found(request: Request, exc: KeyError) -> Response:
        return JSONResponse({"error": str(exc.args[0]) if exc.args else "not found"}, status_code=404)

    @app.get("/favicon.ico")
    def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        entries = list(catalogue().values())
        states = {e.slug: lab.cache.state(e.slug) for e in entries}
        families = [(f, t, [e for e in entries if e.family == f], [k for k in by_slug.values() if k.family == f])
                    for f, t in TITLES.items()]
        built = [s for s in states.values() if s is not None]
        return _page("index.html", families=families, states=states, device=lab.device, found=len(by_slug),
                     total=len(entries), forge_ok=sum(s.path == "forge" and s.status == "ok" for s in built),
                     vendor=sum(s.path == "vendor" for s in built), unbuilt=len(entries) - len(built))

    @app.get("/kernels/{slug}", response_class=HTMLResponse)
    def kernel_page(slug: str) -> str:
        e = entry(slug)
        return _page("kernel.html", e=e, family=TITLES[e.family], state=lab.cache.state(slug), device=lab.device,
                     image_source=image_source())

    _found_routes(app, lab, by_slug)

    @app.post("/api/run/{slug}")
    async def api_run(slug: str, request: Request) -> Response:
        e = entry(slug)
        try:
            raw = await _body(request)
            s = parse_settings(e.inputs, raw, e.param_bounds, (e.lo, e.hi))
            if raw.get("image"):
                if not e.inputs.image:
                    raise ValueError(f"Invalid image: {slug} does not run on an image")
                s = type(s)(s.sizes, s.param, s.lo, s.hi, read_image(_decode(raw["image"])))
            out = await run_in_threadpool(lab.run, e, s)  # in a thread: other pages go on meanwhile
            label = "forge" if out.path == "forge" else "eager"
            pictures = draw(e.picture, out.inputs, out.outputs, out.eager, label)
        except ValueError as err:
            return _bad(str(err))
        return JSONResponse(_json(out, pictures))

    return app


def _found_routes(app: FastAPI, lab: Lab, by_slug: dict[str, Found]) -> None:
    """The pages and the run route of the kernels found by the user's runs."""

    @app.get("/found/{slug}", response_class=HTMLResponse)
    def found_page(slug: str) -> str:
        k = _found(by_slug, slug)
        return _page("found.html", k=k, family=TITLES[k.family], device=lab.device, runs=k.runs_on(lab.device))

    @app.post("/api/found/{slug}")
    async def api_found(slug: str, request: Request) -> Response:
        k = _found(by_slug, slug)
        try:
            lo, hi = parse_range(await _body(request), (-3.0, 3.0))
            out = await run_in_threadpool(lab.run_found, k, lo, hi)
            label = "forge" if out.path == "forge" else "eager"
            pictures = draw(picture(k.spec()), out.inputs, out.outputs, out.eager, label)
        except ValueError as err:
            return _bad(str(err))
        return JSONResponse(_json(out, pictures))


async def _body(request: Request) -> dict[str, Any]:
    """The request's JSON object; ValueError if it is too large or not one."""
    body = await request.body()
    if len(body) > MAX_BODY:
        raise ValueError(f"Invalid request: {len(body)} bytes (at most {MAX_BODY})")
    try:
        raw = json.loads(body or b"{}")
    except ValueError:
        raise ValueError("Invalid request: not JSON") from None
    if not isinstance(raw, dict):
        raise ValueError("Invalid request: not a JSON object")
    return raw


def _found(by_slug: dict[str, Found], slug: str) -> Found:
    if slug not in by_slug:
        raise KeyError(f"no kernel {slug!r} found by your runs")
    return by_slug[slug]


def _bad(message: str) -> JSONResponse:
    log.info("bad lab request: %s", message)
    return JSONResponse({"error": message.splitlines()[0][:400]}, status_code=400)


def _decode(data: object) -> bytes:
    """A data URI's or a plain base64 string's bytes; ValueError if it is neither."""
    if not isinstance(data, str):
        raise ValueError("Invalid image: not a base64 string")
    text = data.split(",", 1)[1] if data.startswith("data:") else data
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("Invalid image: not valid base64") from None


def _json(out: Any, pictures: list[Any]) -> dict[str, Any]:
    speedup = out.eager_us / out.us if out.us and out.eager_us else None
    return {"path": out.path, "why": out.why, "status": out.status, "max_error": out.max_error,
            "us": out.us, "eager_us": out.eager_us, "speedup": speedup, "task": out.task,
            "kernel_source": out.kernel_source, "task_source": out.task_source, "knobs": out.knobs,
            "tried": out.tried,
            "shapes": [list(t.shape) for t in out.outputs],
            "pictures": [{"title": p.title, "uri": p.uri} for p in pictures]}
