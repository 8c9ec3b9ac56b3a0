"""The OpenAI-compatible HTTP server (FastAPI): ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``,
``/health`` and ``/metrics`` (Prometheus) over one `Engine` and its schedulers.

Every error is OpenAI's error object (`hf_mdm.serve.protocol.ApiError`), counted in ``/metrics``. Before a request
reaches its route: ``Authorization: Bearer KEY`` when the server has a key (401; ``/health`` and ``/metrics`` stay
open), 503 while the model loads or the server drains, 415 for a body that is not JSON, 413 above
``max_body_bytes`` (429 and 503 carry ``Retry-After``). A body the server cannot honour is a 400 naming the field
(404 for another ``model``). An exception while generating is that request's 500 (a streamed one gets an error
event, then ``[DONE]``) and the server keeps serving. A client that disconnects cancels its request. On SIGTERM or
Ctrl-C the server drains (`hf_mdm.serve.runner`): new requests get 503, in-flight ones finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException

from ..loading import one_line
from .batcher import MicroBatcher, Scheduler
from .engine import Answer, Engine, Job
from .joining import JoinScheduler
from .protocol import ApiError, Asked, Chunks, answer_body, model_list, parse_request
from .settings import ServeSettings
from .streaming import RowStream, TextSoFar

__all__ = ["build_app", "ServerState"]

DRAIN_TIMEOUT_S = 60.0  # the longest a drain waits for in-flight requests
RETRY_AFTER_S = {429: 1, 503: 5}
ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
OPEN_PATHS = ("/health", "/metrics")  # answered without the API key
log = logging.getLogger("hf_mdm.serve")


class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("hf_mdm_requests", "requests answered", ["endpoint", "status"], registry=self.registry)
        self.latency = Histogram("hf_mdm_request_seconds", "request latency", ["endpoint"], registry=self.registry)
        self.batch = Histogram(
            "hf_mdm_batch_size", "requests per batch", buckets=(1, 2, 4, 8, 16, 32, 64), registry=self.registry
        )
        self.tokens = Counter("hf_mdm_generated_tokens", "completion tokens", registry=self.registry)
        self.queue = Gauge("hf_mdm_queue_depth", "requests waiting or running", registry=self.registry)
        self.forwards = Gauge("hf_mdm_model_forwards", "the model's forward passes so far", registry=self.registry)
        self.in_flight = Gauge("hf_mdm_requests_in_flight", "generation requests in flight", registry=self.registry)


@dataclass
class ServerState:
    """What the app holds: its settings, the engine (None while it loads) and its schedulers, whether the server
    drains, the requests in flight, and why the model could not load (the runner then stops the server)."""

    settings: ServeSettings
    engine: Optional[Engine] = None
    batcher: Optional[MicroBatcher] = None
    joined: Optional[JoinScheduler] = None
    draining: bool = False
    in_flight: int = 0
    load_error: Optional[str] = None

    @property
    def schedulers(self) -> list[Scheduler]:
        return [s for s in (self.batcher, self.joined) if s is not None]

    def scheduler(self, job: Job) -> Scheduler:
        """The join scheduler for a job whose call joins the running calls at their next forward, else the
        micro-batcher."""
        joins = self.joined is not None and self.engine.joins(job)
        return self.joined if joins else self.batcher

    def unavailable(self) -> Optional[ApiError]:
        """The 503 of a generation request now: while the model loads or the server drains."""
        if self.batcher is None or self.draining:
            return ApiError(503, "the server is " + ("shutting down" if self.draining else "loading the model"))
        return None


def build_app(engine: Optional[Engine], settings: ServeSettings, model_name: str, loader: Any = None) -> FastAPI:
    """The app over ``engine`` (or, with ``loader``, an engine built by ``loader()`` in a thread after start-up:
    503 until it is ready; if ``loader`` raises, ``app.state.hf_mdm.load_error`` says why)."""
    metrics, state = _Metrics(), ServerState(settings, engine)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loading = None
        if state.engine is None:
            loading = asyncio.get_running_loop().create_task(_load(state, loader, metrics))
        else:
            _start(state, metrics)
        yield
        state.draining = True
        for scheduler in state.schedulers:
            await scheduler.drain(DRAIN_TIMEOUT_S)
            await scheduler.close()
        if loading is not None:
            loading.cancel()

    app = FastAPI(title="hf_mdm", lifespan=lifespan)
    app.state.hf_mdm = state
    app.add_middleware(_Guard, state=state, metrics=metrics)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> JSONResponse:
        return _error(err)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException) -> JSONResponse:  # 404 and 405 of a wrong route
        return _error(ApiError(err.status_code, str(err.detail)))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, err: Exception) -> JSONResponse:
        return _error(_as_api_error(err))

    @app.get("/health")
    async def health() -> JSONResponse:
        ready = state.unavailable() is None
        status = "ok" if ready else ("draining" if state.draining else "loading")
        return JSONResponse({"status": status}, status_code=200 if ready else 503)

    @app.get("/v1/models")
    async def models() -> dict:
        return model_list(model_name)

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.queue.set(sum(scheduler.busy for scheduler in state.schedulers))
        metrics.forwards.set(state.engine.forwards if state.engine is not None else 0)
        metrics.in_flight.set(state.in_flight)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _answer(request, state, metrics, model_name, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _answer(request, state, metrics, model_name, chat=True)

    return app


def _start(state: ServerState, metrics: _Metrics) -> None:
    def on_batch(size: int, *_: Any) -> None:
        metrics.batch.observe(size)

    settings = state.settings
    max_batch, wait = (1, 0.0) if settings.scheduler == "one" else (settings.max_batch, settings.max_wait_ms)
    state.batcher = MicroBatcher(state.engine, max_batch, wait, settings.max_queue, on_batch)
    state.batcher.start()
    if settings.scheduler == "join":
        state.joined = JoinScheduler(
            state.engine, settings.max_batch, wait, settings.max_queue, settings.max_cache_tokens, on_batch
        )
        state.joined.start()


async def _load(state: ServerState, loader: Any, metrics: _Metrics) -> None:
    try:
        state.engine = await asyncio.get_running_loop().run_in_executor(None, loader)
    except Exception as err:  # the runner stops the server and reports it
        state.load_error = one_line(err)
        return
    _start(state, metrics)


class _Guard:
    """What is checked before a request reaches its route (the API key, the server's readiness, the body's type
    and declared size), and the count of generation requests in flight, from their headers to their response's end
    (a drain waits for them). A plain ASGI middleware: it leaves the route's view of the connection alone, so a
    client that leaves is seen there."""

    def __init__(self, app: Any, state: ServerState, metrics: _Metrics):
        self.app, self.state, self.metrics = app, state, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        try:
            self._check(scope["path"], headers)
        except ApiError as err:
            if scope["path"] in ENDPOINTS:
                self.metrics.requests.labels(ENDPOINTS[scope["path"]], str(err.status)).inc()
            await _error(err)(scope, receive, send)
            return
        if scope["path"] not in ENDPOINTS:
            await self.app(scope, receive, send)
            return
        self.state.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.in_flight -= 1

    def _check(self, path: str, headers: dict) -> None:
        key, settings = self.state.settings.api_key, self.state.settings
        if key is not None and path not in OPEN_PATHS and headers.get("authorization", "") != f"Bearer {key}":
            raise ApiError(401, "a valid API key is required (Authorization: Bearer KEY)", kind="authentication_error")
        if path not in ENDPOINTS:
            return
        unavailable = self.state.unavailable()
        if unavailable is not None:
            raise unavailable
        kind = headers.get("content-type")
        if kind is not None and not _is_json(kind):
            raise ApiError(415, f"the body must be JSON (Content-Type: application/json), not {kind!r}")
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > settings.max_body_bytes:
            raise ApiError(413, f"the body is {length} bytes, above this server's {settings.max_body_bytes}")


def _is_json(content_type: str) -> bool:
    kind = content_type.split(";")[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def _error(err: ApiError) -> JSONResponse:
    retry = RETRY_AFTER_S.get(err.status)
    headers = {"Retry-After": str(retry)} if retry is not None else None
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def _as_api_error(err: BaseException) -> ApiError:
    """``err`` as the client sees it: an `ApiError` as it is; a ValueError, what the samplers raise for settings
    they refuse when they run, a 400 (as vLLM answers it); anything else a 500 (logged with its traceback)."""
    if isinstance(err, ApiError):
        return err
    if isinstance(err, ValueError):
        return ApiError(400, str(err))
    log.error("a request failed", exc_info=err)
    message = f"the server failed on this request ({type(err).__name__}: {err}); it keeps serving others"
    return ApiError(500, message, kind="server_error")


async def _answer(request: Request, state: ServerState, metrics: _Metrics, model_name: str, chat: bool) -> Response:
    endpoint, start = ENDPOINTS[request.url.path], time.monotonic()
    try:
        body = await request.body()
        if len(body) > state.settings.max_body_bytes:
            raise ApiError(413, f"the body is {len(body)} bytes, above this server's {state.settings.max_body_bytes}")
        asked = parse_request(body, chat, served=model_name)
        job = state.engine.prepare(asked)
        scheduler = state.scheduler(job)
        if asked.stream:
            scheduler.check_room()  # a full queue is a 429 before the stream starts
            return _stream(scheduler, state.engine, metrics, job, asked, model_name)
        answer = await _wait(request, scheduler, job)
    except Exception as err:
        error = _as_api_error(err)
        metrics.requests.labels(endpoint, str(error.status)).inc()
        return _error(error)
    metrics.requests.labels(endpoint, "200").inc()
    metrics.latency.labels(endpoint).observe(time.monotonic() - start)
    metrics.tokens.inc(answer.completion_tokens)
    return JSONResponse(answer_body(answer, asked, model_name))


async def _wait(request: Request, scheduler: Scheduler, job: Job) -> Answer:
    """The job's answer; if the client disconnects first, the job is cancelled (a 499 nobody reads)."""
    task = asyncio.ensure_future(scheduler.submit(job))
    while True:
        done, _ = await asyncio.wait({task}, timeout=0.05)
        if done:
            return task.result()
        if await request.is_disconnected():
            job.cancelled.set()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            raise ApiError(499, "the client disconnected")


def _stream(
    scheduler: Scheduler, engine: Engine, metrics: _Metrics, job: Job, asked: Asked, model_name: str
) -> Response:
    """Server-sent events: chunks of final text, then the one with the finish reason (and usage if asked), then
    ``[DONE]``, as OpenAI's stream ends; a request that fails gets an event with the error object, then ``[DONE]``."""
    job.stream, chunks = RowStream(asyncio.get_running_loop()), Chunks(asked, model_name)
    endpoint, start = "chat" if asked.chat else "completions", time.monotonic()

    async def events() -> AsyncIterator[dict]:
        task = asyncio.ensure_future(scheduler.submit(job))
        task.add_done_callback(lambda _: job.stream.close())  # a job that fails does not end its stream itself
        so_far, status = TextSoFar(engine, job), "499"
        try:
            if asked.chat:
                yield {"data": chunks.role()}
            while (tokens := await job.stream.next()) is not None:
                delta = so_far.add(tokens)
                if delta:
                    yield {"data": chunks.text(delta)}
            try:
                answer = await task
            except Exception as err:
                error = _as_api_error(err)
                status = str(error.status)
                yield {"data": json.dumps(error.body())}
                yield {"data": "[DONE]"}
                return
            if so_far.rest(answer.text):
                yield {"data": chunks.text(so_far.rest(answer.text))}
            yield {"data": chunks.text("", answer.finish_reason)}
            if asked.include_usage:
                yield {"data": chunks.usage(answer)}
            status = "200"
            metrics.tokens.inc(answer.completion_tokens)
            metrics.latency.labels(endpoint).observe(time.monotonic() - start)
            yield {"data": "[DONE]"}
        finally:
            metrics.requests.labels(endpoint, status).inc()
            if not task.done():
                job.cancelled.set()  # the client left mid-stream: its row stops at the next block boundary

    return EventSourceResponse(events(), ping=15)
