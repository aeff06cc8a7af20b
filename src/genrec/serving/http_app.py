"""The FastAPI application: :func:`create_app` / :func:`build_app` wire worker -> scheduler
-> :class:`~genrec.serving.endpoints.Service` -> routes (:mod:`genrec.serving.routes`), behind
a guard (body size, draining, metrics) and the error mapping (:mod:`genrec.serving.http_errors`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from genrec.engine import Engine
from genrec.engine.ensemble import Ensemble
from genrec.serving.admission import Admission
from genrec.serving.auth import ApiKeyMiddleware
from genrec.serving.backends import CatalogUpdater, Ranker
from genrec.serving.endpoints import Service
from genrec.serving.http_errors import error_response, map_errors
from genrec.serving.openai_api import OpenAIErrors
from genrec.serving.prometheus import ServerMetrics
from genrec.serving.routes import ROUTES, add_probes, add_routes
from genrec.serving.scheduler import BatchScheduler, Stages
from genrec.serving.spec import ServeConfig
from genrec.serving.worker import BatchWorker, Worker

log = logging.getLogger("genrec.serving")


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
            reply = error_response(413, f"body: larger than {self.config.max_body_bytes} bytes")
        elif self.state.draining and path.startswith("/v1/"):
            self.metrics.reject("draining")
            reply = error_response(503, "server is shutting down", retry)
        else:
            reply = None
            try:
                await self.app(scope, receive, send_status)
            except Exception:
                log.exception("unhandled error on %s", path)
                if status[0]:  # the answer had started: nothing more to send
                    raise
                reply = error_response(500, "internal server error")
        if reply is not None:
            await reply(scope, receive, send_status)
        if endpoint != "/metrics":
            self.metrics.observe_request(endpoint, status[0], time.perf_counter() - start)



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
    map_errors(app, metrics, config)
    add_routes(app, service)
    add_probes(app, worker, service, metrics)
    return app
