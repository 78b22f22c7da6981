"""The ASGI app of `vitkit serve` (Starlette): routes, bearer-token check, request metrics, JSON errors.

    GET  /            the page (self-contained HTML; no token needed: it holds no data)
    GET  /health      200 {model, classes, resolution, ...} once loaded and warmed up, else 503
    GET  /metrics     Prometheus text
    POST /v1/predict  ?top_k=K            one image (image/*) or a multipart form of 'file' fields
    POST /v1/explain  ?top_k=K&format=png prediction + attention rollout + PNG overlay

Every error is `{"error": "..."}` with its status: 400 undecodable / bad parameter, 401 token, 408 body
too slow, 413 body or image too large, 415 content type, 422 explain without attention, 503 loading or
busy (Retry-After).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import difflib
import hmac
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vitkit.serve.body import HTTPError, read_images
from vitkit.serve.config import ServeConfig
from vitkit.serve.model import ServedModel, load_model
from vitkit.serve.service import Service

log = logging.getLogger(__name__)

ROUTES = ("/", "/health", "/metrics", "/v1/predict", "/v1/explain")
PUBLIC = ("/",)  # the page is static; it sends the token the user types with every API call
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; connect-src 'self'; img-src 'self' data: blob:; "
    "style-src 'unsafe-inline'; script-src 'unsafe-inline'",
    "X-Content-Type-Options": "nosniff",
}


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class Guard:
    """Outermost layer: the bearer-token check and the per-route request metrics (status and latency
    of every request, including refused and failed ones).  An answer that starts before the request's body has
    all arrived closes the connection (`_closing_if_unread`)."""

    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app, self.service = app, service
        token = service.config.token
        self.expected = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = path if path in ROUTES else "other"
        start, status = time.perf_counter(), [500]
        receive, send = _closing_if_unread(scope, receive, send)

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            if self.expected is not None and path not in PUBLIC and not self._authorised(scope):
                response = error_response(
                    401,
                    "missing or wrong bearer token: send 'Authorization: Bearer TOKEN'",
                    {"WWW-Authenticate": "Bearer"},
                )
                await response(scope, receive, send_status)
            else:
                await self.app(scope, receive, send_status)
        finally:
            self.service.metrics.observe_request(route, status[0], time.perf_counter() - start)

    def _authorised(self, scope: Scope) -> bool:
        """`Authorization: Bearer TOKEN`, the scheme's name in any case (RFC 7235)."""
        scheme, _, given = dict(scope["headers"]).get(b"authorization", b"").strip().partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.expected)


def _closing_if_unread(scope: Scope, receive: Receive, send: Send) -> tuple[Receive, Send]:
    """`receive` and `send`, watched: an answer that starts before the request's body has all arrived (any
    method, any status) says `Connection: close`, since uvicorn would read the rest, and drop it, for as long
    as it trickles in, each byte restarting its keep-alive clock."""
    headers = dict(scope["headers"])
    done = [headers.get(b"content-length", b"0").strip() in (b"", b"0") and b"transfer-encoding" not in headers]

    async def watched_receive() -> Message:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):  # the end, or a disconnect
            done[0] = True
        return message

    async def closing_send(message: Message) -> None:
        if message["type"] == "http.response.start" and not done[0]:
            kept = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
            message = {**message, "headers": [*kept, (b"connection", b"close")]}
        await send(message)

    return watched_receive, closing_send


def _check_parameters(request: Request) -> None:
    """A query parameter the routes do not take (a misspelt `topk`), or one given twice, is refused, not silently
    passed over."""
    known = ("top_k", "format")
    for name in request.query_params:
        if len(request.query_params.getlist(name)) > 1 and name in known:  # which one was meant?
            raise HTTPError(400, f"query parameter {name!r} given more than once")
        if name not in known:
            close = difflib.get_close_matches(name.lower(), known, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            shown = name if len(name) <= 20 else f"{name[:20]}..."
            raise HTTPError(
                400, f"unknown query parameter {shown!r}: {request.url.path} takes {', '.join(known)}{hint}"
            )


def _top_k(request: Request) -> int:
    """?top_k: 1 to 9 ASCII digits, positive (str.isdigit and int() take other scripts' digits too)."""
    raw = request.query_params.get("top_k", "5")
    if not re.fullmatch(r"[0-9]{1,9}", raw) or int(raw) < 1:
        shown = raw if len(raw) <= 20 else f"{raw[:20]}... ({len(raw):,} characters)"
        raise HTTPError(400, f"top_k must be a positive integer of at most 9 digits, got {shown!r}")
    return int(raw)


async def _images(request: Request, explain: bool) -> Response:
    service: Service = request.app.state.service
    model = service.ready()
    if explain and not model.explainable:
        raise HTTPError(
            422,
            f"explain needs a Vision Transformer: {model.info['model']} has no attention "
            "weights to roll out; /v1/predict works for it",
        )
    _check_parameters(request)
    top_k, form = _top_k(request), request.query_params.get("format", "json")
    if form not in ("json", "png") or (form == "png" and not explain):
        raise HTTPError(400, f"format must be 'json' (or 'png' on /v1/explain), got {form!r}")
    with service.admit(), service.bodies.hold() as take:
        config = service.config
        uploads, multipart = await read_images(
            request, config.max_body_bytes, config.max_files, config.body_timeout_s, take
        )
        if form == "png" and len(uploads) != 1:
            raise HTTPError(400, f"format=png returns one image; this request holds {len(uploads)}")
        answers = await service.answer(uploads, top_k, explain, each=multipart)
    if form == "png":
        return Response(base64.b64decode(answers[0]["overlay_png"]), media_type="image/png")
    if not multipart:
        return JSONResponse(answers[0])
    return JSONResponse({"results": [{"file": upload.name, **answer} for upload, answer in zip(uploads, answers)]})


async def predict(request: Request) -> Response:
    return await _images(request, explain=False)


async def explain(request: Request) -> Response:
    return await _images(request, explain=True)


async def health(request: Request) -> Response:
    model = request.app.state.service.ready()
    return JSONResponse({"status": "ok", **model.info})


async def metrics(request: Request) -> Response:
    body, content_type = request.app.state.service.metrics.render()
    return Response(body, headers={"Content-Type": content_type})


async def page(request: Request) -> Response:
    return HTMLResponse(request.app.state.page, headers=PAGE_HEADERS)


def _json_errors(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """The route's answer, or its failure as {"error"}: an HTTPError with its status, anything else a logged 500
    (the exception stops here: the server goes on)."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except HTTPError as error:
            return error_response(error.status, error.message, error.headers)
        except asyncio.CancelledError:  # the drain timeout passed after SIGTERM: uvicorn would answer a text 500
            if (task := asyncio.current_task()) is not None:
                task.uncancel()  # answered here: the task is no longer being cancelled
            request.app.state.service.cut += 1
            message = "the server stopped before this request was answered (its drain timeout passed); retry"
            return error_response(503, message, {"retry-after": "1"})
        except Exception as error:  # noqa: BLE001 - no request may take the server down
            log.error("internal error on %s %s", request.method, request.url.path, exc_info=error)
            return error_response(500, f"internal error ({type(error).__name__}); the server log has the details")

    return endpoint


async def _router_error(request: Request, error: Exception) -> Response:
    """404 unknown route, 405 wrong method, ... as JSON."""
    status = getattr(error, "status_code", 500)
    return error_response(status, str(getattr(error, "detail", error)), dict(getattr(error, "headers", None) or {}))


def create_app(
    path: str | os.PathLike,
    config: ServeConfig | None = None,
    *,
    load: Callable[[str | os.PathLike, str], ServedModel] = load_model,
    on_load_failure: Callable[[str], None] | None = None,
) -> Starlette:
    """The app serving the checkpoint (or run directory) `path`; the model loads when the app starts
    (its lifespan), in the background, so /health answers 503 until it is ready."""
    config = config or ServeConfig()
    service = Service(path, config, load=load, on_load_failure=on_load_failure)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        loading = asyncio.get_running_loop().create_task(service.start(), name="vitkit-load")
        try:
            yield
        finally:
            loading.cancel()
            await service.stop()

    routes = [
        Route("/", _json_errors(page), methods=["GET"]),
        Route("/health", _json_errors(health), methods=["GET"]),
        Route("/metrics", _json_errors(metrics), methods=["GET"]),
        Route("/v1/predict", _json_errors(predict), methods=["POST"]),
        Route("/v1/explain", _json_errors(explain), methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _router_error}, lifespan=lifespan)
    app.router.redirect_slashes = False  # a 307 with no body, its Location taken from the client's Host: a 404
    app.add_middleware(Guard, service=service)
    app.state.service = service
    app.state.page = resources.files("vitkit.serve").joinpath("page/index.html").read_text(encoding="utf-8")
    return app
