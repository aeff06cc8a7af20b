"""The FastAPI application: routes, error mapping, metrics and readiness.

Every error is JSON ``{"detail": "<message naming the field>"}``: bad input 422 (schema or
engine ``InputError``), missing or wrong API key 401 (:mod:`genrec.serving.auth`),
unavailable feature 400, unknown model 404, body too large or a request over the memory budget
413, queue full, draining or a batch that does not fit in memory now (or ran out of it) 503
with ``Retry-After`` (also when the engine process is gone), deadline passed 504. On the
OpenAI-style routes (``/v1/completions``, ``/v1/models``) the same errors come in OpenAI's
shape, ``{"error": {"message", "type", "param", "code"}}`` (:mod:`genrec.serving.openai_api`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from genrec.engine import Engine
from genrec.engine.ensemble import Ensemble
from genrec.serving import schemas as S
from genrec.serving.admission import Admission, MemoryBusyError, RequestTooLargeError
from genrec.serving.auth import ApiKeyMiddleware
from genrec.serving.backends import CatalogUpdater, Ranker
from genrec.serving.engine_process import EngineGoneError
from genrec.serving.metrics import ServerMetrics
from genrec.serving.openai_api import OpenAIErrors, check_model, model_card, model_list
from genrec.serving.scheduler import (
    BatchScheduler,
    DeadlineExceededError,
    DrainingError,
    QueueFullError,
    Stages,
)
from genrec.serving.service import ApiError, CatalogBehindError, Service
from genrec.serving.spec import ServeConfig
from genrec.serving.worker import BatchWorker, Worker

log = logging.getLogger("genrec.serving")

ROUTES = ("/v1/recommend", "/v1/rank", "/v1/score", "/v1/completions", "/v1/models",
          "/v1/catalog/items", "/health", "/ready", "/metrics")


def _field(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p != "body"]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out or "body"


def validation_detail(err: RequestValidationError) -> str:
    """One message naming the fields of a schema error (at most three listed)."""
    messages = []
    for e in err.errors()[:3]:
        if e.get("type") == "json_invalid":
            messages.append(f"body: invalid JSON ({e.get('ctx', {}).get('error', e['msg'])})")
        elif e.get("type") == "missing" and tuple(e.get("loc", ())) == ("body",):
            messages.append("body: a JSON object is required")
        elif e.get("type") == "model_attributes_type" and tuple(e.get("loc", ())) == ("body",):
            messages.append("body: expected a JSON object (with Content-Type: "
                            "application/json)")
        else:
            messages.append(f"{_field(tuple(e.get('loc', ())))}: {e['msg']}")
    more = len(err.errors()) - 3
    return "; ".join(messages) + (f" (and {more} more errors)" if more > 0 else "")


def _deadline(request: Request, body_ms: int | None) -> float | None:
    header = request.headers.get("x-deadline-ms")
    values = [] if body_ms is None else [float(body_ms)]
    if header is not None:
        try:
            value = float(header)
        except ValueError:
            raise ValueError(f"X-Deadline-Ms: expected milliseconds, got {header!r}") from None
        if not 0 < value < float("inf"):
            raise ValueError(f"X-Deadline-Ms: must be a positive number, got {header!r}")
        values.append(value)
    return min(values) if values else None


def _min_version(request: Request, body: Any) -> Any:
    """``body`` with ``min_catalog_version`` raised to the ``X-Min-Catalog-Version`` header's
    (the larger of the two counts)."""
    header = request.headers.get("x-min-catalog-version")
    if header is None:
        return body
    if not header.strip().isdigit() or int(header) >= S.INT64_END:
        raise ValueError(f"X-Min-Catalog-Version: expected a catalog version, got {header!r}")
    wanted = max(int(header), body.min_catalog_version or 0)
    return body.model_copy(update={"min_catalog_version": wanted})


class _Guard:
    """ASGI middleware: refuses oversized bodies (413) and, while draining, new ``/v1``
    requests (503); turns unhandled errors into a bare 500; records every answer's metrics."""

    def __init__(self, app: Any, state: Any, metrics: ServerMetrics, config: ServeConfig) -> None:
        self.app, self.state, self.metrics, self.config = app, state, metrics, config

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        path = scope["path"]
        endpoint = path if path in ROUTES else "other"
        status = [0]  # 0 until the answer starts

        async def send_status(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        length = dict(scope["headers"]).get(b"content-length", b"")
        retry = {"Retry-After": str(self.config.retry_after_s)}
        if length.isdigit() and int(length) > self.config.max_body_bytes:
            reply = _error(413, f"body: larger than {self.config.max_body_bytes} bytes")
        elif self.state.draining and path.startswith("/v1/"):
            self.metrics.reject("draining")
            reply = _error(503, "server is shutting down", retry)
        else:
            reply = None
            try:
                await self.app(scope, receive, send_status)
            except Exception:
                log.exception("unhandled error on %s", path)
                if status[0]:  # the answer had started: nothing more to send
                    raise
                reply = _error(500, "internal server error")
        if reply is not None:
            await reply(scope, receive, send_status)
        if endpoint != "/metrics":
            self.metrics.observe_request(endpoint, status[0], time.perf_counter() - start)


def _error(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def create_app(
    engine: Engine, *, ranker: Ranker | None = None,
    catalog_updater: CatalogUpdater | None = None, tokenizer: Any = None,
    config: ServeConfig | None = None, ensemble: Ensemble | None = None,
) -> FastAPI:
    """The server around ``engine`` (and optionally a ranker for ``/v1/rank`` and reranking,
    a catalog updater for ``/v1/catalog/items``, a tokenizer for text in ``/v1/score``, an
    ensemble whose first member is ``engine`` for ``/v1/recommend``), its batches run in this
    process: :func:`build_app` over a :class:`Worker` of them."""
    config = config or ServeConfig()
    worker = Worker(engine, ranker, catalog_updater, config.compact_threshold, ensemble)
    return build_app(worker, tokenizer=tokenizer, config=config)


def overlap_stages(worker: BatchWorker, overlap: bool | None) -> Stages | None:
    """The two steps of a batch when the scheduler overlaps packing with the engine's run
    (``overlap``; ``None``: on a GPU), for a worker that runs its batches here."""
    if not isinstance(worker, Worker):  # an engine-process proxy: its batches run there
        return None
    if overlap is None:
        overlap = worker.engine.model.device.type == "cuda"
    if not overlap:
        return None
    return Stages(worker.prepare, worker.finish, worker.barrier)


def build_app(worker: BatchWorker, *, tokenizer: Any = None,
              config: ServeConfig | None = None) -> FastAPI:
    """The server whose batches run on ``worker`` (a :class:`Worker`, or an
    :class:`~genrec.serving.engine_process.EngineProcess` proxy); a request goes route ->
    :class:`Service` (checks it) -> :class:`BatchScheduler` -> ``worker.run`` -> engine.

    ``app.state.service``, ``app.state.scheduler`` and ``app.state.worker`` give access to
    them; set ``app.state.draining = True`` (or call ``app.state.scheduler.begin_drain()``) to
    make ``/ready`` answer 503 before a shutdown. The worker is closed with the app.
    """
    config = config or ServeConfig()
    metrics = ServerMetrics(lambda: scheduler.queue_depth(), lambda: worker.catalog_version,
                            worker.catalog_stats, worker.engine.memory.total)
    admission = Admission(worker.engine, metrics.observe_split)
    stages = overlap_stages(worker, config.overlap)
    scheduler = BatchScheduler(admission.runner(worker.run), config.max_batch_size,
                               config.max_wait_ms, config.max_queue,
                               observer=lambda message, size, seconds:
                               metrics.observe_batch(message.kind, size, seconds),
                               stages=admission.stages(stages) if stages else None)
    service = Service(worker, scheduler, tokenizer, config.model_name, admission)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        app.state.draining = True
        if not scheduler.close(config.drain_timeout_s):
            log.warning("engine worker still busy after %.0f s of draining",
                        config.drain_timeout_s)
        worker.close()

    app = FastAPI(title="genrec", version="0.1.0", lifespan=lifespan)
    app.state.service, app.state.scheduler, app.state.metrics = service, scheduler, metrics
    app.state.worker, app.state.config, app.state.draining = worker, config, False

    if config.api_key is not None or config.admin_key is not None:
        # inside the guard (added before it): refused requests are counted in the metrics
        # and never reach a route
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key, admin_key=config.admin_key)
    app.add_middleware(_Guard, state=app.state, metrics=metrics, config=config)
    app.add_middleware(OpenAIErrors)  # outermost: reshapes the guard's errors too
    _map_errors(app, metrics, config)
    _add_routes(app, service)
    _add_probes(app, worker, service, metrics)
    return app


def _map_errors(app: FastAPI, metrics: ServerMetrics, config: ServeConfig) -> None:
    """Exceptions -> JSON errors (the status codes of the module docstring)."""
    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        return _error(422, validation_detail(err))

    @app.exception_handler(ApiError)
    async def _api(_: Request, err: ApiError) -> JSONResponse:
        return _error(err.status_code, err.detail)

    @app.exception_handler(ValueError)
    async def _value(_: Request, err: ValueError) -> JSONResponse:
        return _error(422, str(err))

    @app.exception_handler(QueueFullError)
    async def _full(_: Request, err: QueueFullError) -> JSONResponse:
        metrics.reject("queue_full")
        return _error(503, str(err), {"Retry-After": str(config.retry_after_s)})

    @app.exception_handler(CatalogBehindError)
    async def _behind(_: Request, err: CatalogBehindError) -> JSONResponse:
        metrics.reject("catalog_behind")
        return _error(503, str(err), {"Retry-After": str(config.retry_after_s)})

    @app.exception_handler(DrainingError)
    async def _draining(_: Request, err: DrainingError) -> JSONResponse:
        metrics.reject("draining")
        return _error(503, str(err), {"Retry-After": str(config.retry_after_s)})

    @app.exception_handler(EngineGoneError)
    async def _gone(_: Request, err: EngineGoneError) -> JSONResponse:
        return _error(503, str(err), {"Retry-After": str(config.retry_after_s)})

    @app.exception_handler(RequestTooLargeError)
    async def _too_large(_: Request, err: RequestTooLargeError) -> JSONResponse:
        metrics.reject("too_large")
        return _error(413, str(err))

    @app.exception_handler(MemoryBusyError)
    async def _memory(_: Request, err: MemoryBusyError) -> JSONResponse:
        metrics.reject("memory")
        return _error(503, str(err), {"Retry-After": str(config.retry_after_s)})

    @app.exception_handler(DeadlineExceededError)
    async def _late(_: Request, err: DeadlineExceededError) -> JSONResponse:
        metrics.reject("deadline")
        return _error(504, str(err))


def _add_routes(app: FastAPI, service: Service) -> None:
    """The ``/v1`` endpoints: each a :class:`Service` method."""
    @app.post("/v1/recommend", response_model=S.RecommendResponse)
    async def recommend(body: S.RecommendBody, request: Request) -> dict:
        """Top-n catalog items by constrained beam search (``rerank``: then the ranker)."""
        return await service.recommend(_min_version(request, body),
                                       _deadline(request, body.deadline_ms))

    @app.post("/v1/rank", response_model=S.RankResponse)
    async def rank(body: S.RankBody, request: Request) -> dict:
        """Scores of candidate items by the loaded ranker."""
        return await service.rank(_min_version(request, body),
                                  _deadline(request, body.deadline_ms))

    @app.post("/v1/score", response_model=S.ScoreResponse)
    async def score(body: S.ScoreBody, request: Request) -> dict:
        """SGLang-compatible label probabilities after query + item."""
        return await service.score(_min_version(request, body),
                                   _deadline(request, body.deadline_ms))

    @app.post("/v1/completions", response_model=S.CompletionResponse)
    async def completions(body: S.CompletionBody, request: Request) -> dict:
        """OpenAI-compatible completions subset (constrained beam search)."""
        check_model(body.model, service.model_name)
        return await service.complete(_min_version(request, body),
                                      _deadline(request, body.deadline_ms))

    created = int(time.time())

    @app.get("/v1/models", response_model=S.ModelList)
    async def models() -> dict:
        """OpenAI's model list: the served model (``--served-model-name``)."""
        return model_list(service.model_name, created)

    @app.get("/v1/models/{model:path}", response_model=S.ModelCard)
    async def model(model: str) -> dict:
        """OpenAI's model object of the served model (404 for any other name)."""
        check_model(model, service.model_name)
        return model_card(service.model_name, created)

    @app.put("/v1/catalog/items", response_model=S.CatalogResponse,
             response_model_exclude_none=True)
    async def upsert_items(body: S.CatalogUpsertBody, request: Request) -> dict:
        """Add or replace catalog items, all or nothing. An item with ``semantic_id`` (one code
        per level) joins the generative catalog (new Semantic-ID index and trie, swapped in
        at once), so ``/v1/recommend`` can return it; an item without one, or with ranker
        fields (``text``, encoded by the item encoder, or ``vectors``), goes to the ranker.
        An item without ``semantic_id`` but with ``embedding`` (or ``text``) gets the one the
        index's saved codebooks give it (listed in the answer's ``semantic_ids``). The
        answer's ``catalogs`` lists the item ids each catalog took; ``catalog_version`` is the
        service's one catalog version."""
        items = [item.model_dump() for item in body.items]
        return await service.update_catalog("upsert", items, _deadline(request, None))

    @app.delete("/v1/catalog/items", response_model=S.CatalogResponse,
                response_model_exclude_none=True)
    async def retire_items(body: S.CatalogRetireBody, request: Request) -> dict:
        """Retire catalog items, all or nothing, from the generative catalog (never returned
        by ``/v1/recommend`` again) and from the ranker (rejected by ``/v1/rank``)."""
        return await service.update_catalog("retire", body.item_ids, _deadline(request, None))


def _add_probes(app: FastAPI, worker: BatchWorker, service: Service,
                metrics: ServerMetrics) -> None:
    """``/health``, ``/ready`` and ``/metrics``."""

    def engine_gone() -> JSONResponse | None:
        return None if worker.alive else _error(503, "the engine process exited")

    @app.get("/health", response_model=None)
    async def health() -> dict | JSONResponse:
        """The process is up (and, with an engine process, so is that one)."""
        return engine_gone() or {"status": "ok"}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """The model is loaded and the server is not draining."""
        gone = engine_gone()
        if gone is not None:
            return gone
        if app.state.draining or not service.scheduler.accepting:
            return _error(503, "draining")
        return JSONResponse({"status": "ready", "catalog_version": service.catalog_version()})

    @app.get("/metrics")
    async def prometheus() -> Response:
        """Prometheus metrics."""
        return Response(metrics.render(), media_type=metrics.content_type)
