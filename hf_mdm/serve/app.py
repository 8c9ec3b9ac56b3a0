"""The OpenAI-compatible HTTP server (FastAPI): ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``,
``/health`` and ``/metrics`` (Prometheus) over one `Engine` and its `MicroBatcher`.

Limits and failure: ``Authorization: Bearer KEY`` when the server has a key (401 otherwise); bodies above
``max_body_bytes`` are 413; a full queue 429; 503 while the model loads or the server drains; a request the server
cannot honour (``n > 1``, ``logprobs``, tools, an unknown field or a bad setting) is a 400 with OpenAI's error
object. A client that disconnects cancels its request (dropped before its batch, or its row stops at the next block
boundary). On shutdown (SIGTERM under uvicorn) new requests get 503 and in-flight ones finish first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from typing import Any, AsyncIterator, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from sse_starlette.sse import EventSourceResponse

from .batcher import MicroBatcher
from .engine import Answer, Engine, Job
from .joining import JoinScheduler
from .requests import ApiError, Asked, parse_request
from .settings import ServeSettings
from .streaming import RowStream, TextSoFar

__all__ = ["build_app"]

DRAIN_TIMEOUT_S = 60.0


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


def build_app(engine: Optional[Engine], settings: ServeSettings, model_name: str, loader: Any = None) -> FastAPI:
    """The app over ``engine`` (or, with ``loader``, an engine built by ``loader()`` in a thread after start-up:
    503 until it is ready)."""
    metrics = _Metrics()
    state: dict[str, Any] = {"engine": engine, "batcher": None, "blocks": None, "draining": False, "settings": settings}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loading = None
        if state["engine"] is None:
            loading = asyncio.get_running_loop().create_task(_load(state, loader, settings, metrics))
        else:
            _start(state, settings, metrics)
        yield
        state["draining"] = True
        for name in ("batcher", "blocks"):
            if state[name] is not None:
                await state[name].drain(DRAIN_TIMEOUT_S)
                await state[name].close()
        if loading is not None:
            loading.cancel()

    app = FastAPI(title="hf_mdm", lifespan=lifespan)
    app.state.hf_mdm = state

    app.add_middleware(_Guard, settings=settings)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> JSONResponse:
        return _error(err)

    @app.get("/health")
    async def health() -> JSONResponse:
        ready = state["batcher"] is not None and not state["draining"]
        status = "ok" if ready else ("draining" if state["draining"] else "loading")
        return JSONResponse({"status": status}, status_code=200 if ready else 503)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "hf_mdm"}]}

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.queue.set(sum(state[name].busy for name in ("batcher", "blocks") if state[name] is not None))
        metrics.forwards.set(state["engine"].forwards if state["engine"] is not None else 0)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _answer(request, state, metrics, model_name, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _answer(request, state, metrics, model_name, chat=True)

    return app


def _scheduler(state: dict, job: Job) -> Any:
    """The join scheduler for a job that joins running calls at their next forward, else the micro-batcher."""
    blocks = state["blocks"]
    return blocks if blocks is not None and state["engine"].joins(job) else state["batcher"]


def _start(state: dict, settings: ServeSettings, metrics: _Metrics) -> None:
    def on_batch(size: int, *_: Any) -> None:
        metrics.batch.observe(size)

    one = settings.scheduler == "one"
    max_batch, wait = (1, 0.0) if one else (settings.max_batch, settings.max_wait_ms)
    batcher = MicroBatcher(state["engine"], max_batch, wait, settings.max_queue, on_batch)
    batcher.start()
    state["batcher"] = batcher
    if settings.scheduler == "join":
        state["blocks"] = JoinScheduler(
            state["engine"], settings.max_batch, settings.max_queue, settings.max_cache_tokens, on_batch
        )
        state["blocks"].start()


async def _load(state: dict, loader: Any, settings: ServeSettings, metrics: _Metrics) -> None:
    state["engine"] = await asyncio.get_running_loop().run_in_executor(None, loader)
    _start(state, settings, metrics)


class _Guard:
    """The API key and the body's declared size, checked before a request reaches its route (a plain ASGI
    middleware: it leaves the route's view of the connection alone, so a client that leaves is seen there)."""

    def __init__(self, app: Any, settings: ServeSettings):
        self.app, self.settings = app, settings

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            try:
                self._check(scope["path"], headers)
            except ApiError as err:
                await _error(err)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _check(self, path: str, headers: dict) -> None:
        key = self.settings.api_key
        if key is not None and path != "/health" and headers.get("authorization", "") != f"Bearer {key}":
            raise ApiError(401, "a valid API key is required (Authorization: Bearer KEY)", kind="authentication_error")
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.settings.max_body_bytes:
            raise ApiError(413, f"the body is {length} bytes, above this server's {self.settings.max_body_bytes}")


def _error(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


async def _answer(request: Request, state: dict, metrics: _Metrics, model_name: str, chat: bool) -> Response:
    endpoint, start = "chat" if chat else "completions", time.monotonic()
    try:
        if state["batcher"] is None or state["draining"]:
            raise ApiError(503, "the server is " + ("shutting down" if state["draining"] else "loading the model"))
        body = await request.body()
        if len(body) > state["settings"].max_body_bytes:
            raise ApiError(
                413, f"the body is {len(body)} bytes, above this server's {state['settings'].max_body_bytes}"
            )
        try:
            parsed = json.loads(body)
        except ValueError as err:
            raise ApiError(400, f"the body is not JSON: {err}") from err
        asked = parse_request(parsed, chat)
        job = state["engine"].prepare(asked)
        if asked.stream:
            metrics.requests.labels(endpoint, "200").inc()
            return _stream(request, state, metrics, job, asked, model_name)
        answer = await _wait(request, _scheduler(state, job), job)
    except ApiError as err:
        metrics.requests.labels(endpoint, str(err.status)).inc()
        return _error(err)
    metrics.requests.labels(endpoint, "200").inc()
    metrics.latency.labels(endpoint).observe(time.monotonic() - start)
    metrics.tokens.inc(answer.completion_tokens)
    return JSONResponse(_body(answer, asked, model_name))


async def _wait(request: Request, batcher: Any, job: Job) -> Answer:
    """The job's answer; if the client disconnects first, the job is cancelled (a 499 nobody reads)."""
    task = asyncio.ensure_future(batcher.submit(job))
    while True:
        done, _ = await asyncio.wait({task}, timeout=0.05)
        if done:
            return task.result()
        if await request.is_disconnected():
            job.cancelled.set()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            raise ApiError(499, "the client disconnected")


def _body(answer: Answer, asked: Asked, model_name: str) -> dict:
    usage = {"prompt_tokens": answer.prompt_tokens, "completion_tokens": answer.completion_tokens}
    usage["total_tokens"] = answer.prompt_tokens + answer.completion_tokens
    if asked.chat:
        message = {"role": "assistant", "content": answer.text}
        choice = {"index": 0, "message": message, "finish_reason": answer.finish_reason, "logprobs": None}
        kind, prefix = "chat.completion", "chatcmpl"
    else:
        choice = {"index": 0, "text": answer.text, "finish_reason": answer.finish_reason, "logprobs": None}
        kind, prefix = "text_completion", "cmpl"
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": model_name,
            "choices": [choice], "usage": usage}  # fmt: skip


def _stream(request: Request, state: dict, metrics: _Metrics, job: Job, asked: Asked, model_name: str) -> Response:
    """Server-sent events: chunks of final text, then the one with the finish reason (and usage if asked), then
    ``[DONE]``, as OpenAI's stream ends."""
    job.stream = RowStream(asyncio.get_running_loop())
    ident, created = f"{'chatcmpl' if asked.chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())

    def chunk(text: Optional[str], reason: Optional[str], usage: Optional[dict] = None) -> str:
        if asked.chat:
            delta = {} if text is None else {"content": text}
            choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": reason, "logprobs": None}
            kind = "text_completion"
        body = {
            "id": ident,
            "object": kind,
            "created": created,
            "model": model_name,
            "choices": [choice] if usage is None else [],
        }
        if usage is not None:
            body["usage"] = usage
        return json.dumps(body)

    async def events() -> AsyncIterator[dict]:
        task = asyncio.ensure_future(_scheduler(state, job).submit(job))
        so_far = TextSoFar(state["engine"], job)
        try:
            if asked.chat:
                yield {
                    "data": json.dumps(
                        json.loads(chunk(None, None))
                        | {
                            "choices": [
                                {
                                    "index": 0,
                                    "delta": {"role": "assistant", "content": ""},
                                    "finish_reason": None,
                                    "logprobs": None,
                                }
                            ]
                        }
                    )
                }
            while (tokens := await job.stream.next()) is not None:
                delta = so_far.add(tokens)
                if delta:
                    yield {"data": chunk(delta, None)}
            answer = await task
            if so_far.rest(answer.text):
                yield {"data": chunk(so_far.rest(answer.text), None)}
            yield {"data": chunk(None if asked.chat else "", answer.finish_reason)}
            if asked.include_usage:
                usage = {"prompt_tokens": answer.prompt_tokens, "completion_tokens": answer.completion_tokens,
                         "total_tokens": answer.prompt_tokens + answer.completion_tokens}  # fmt: skip
                yield {"data": chunk(None, None, usage)}
            metrics.tokens.inc(answer.completion_tokens)
            yield {"data": "[DONE]"}
        finally:
            if not task.done():
                job.cancelled.set()  # the client left mid-stream: its row stops at the next block boundary

    return EventSourceResponse(events(), ping=15)
