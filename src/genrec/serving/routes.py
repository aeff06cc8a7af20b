"""The server's routes: the ``/v1`` endpoints (each an
:class:`~genrec.serving.endpoints.Service` method, with the request's deadline and minimum
catalog version from its headers) and the probes ``/health``, ``/ready``, ``/metrics``."""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from genrec.serving import schemas as S
from genrec.serving.endpoints import Service
from genrec.serving.http_errors import error_response
from genrec.serving.openai_api import check_model, model_card, model_list
from genrec.serving.prometheus import ServerMetrics
from genrec.serving.worker import BatchWorker

ROUTES = ("/v1/recommend", "/v1/rank", "/v1/score", "/v1/completions", "/v1/models",
          "/v1/catalog/items", "/health", "/ready", "/metrics")


def _shown(header: str, limit: int = 40) -> str:
    """A header value as an error message quotes it: at most ``limit`` characters."""
    return repr(header) if len(header) <= limit else f"{header[:limit]!r}... ({len(header)} chars)"


def _deadline(request: Request, body_ms: int | None) -> float | None:
    header = request.headers.get("x-deadline-ms")
    values = [] if body_ms is None else [float(body_ms)]
    if header is not None:
        try:
            value = float(header)
        except ValueError:
            raise ValueError("X-Deadline-Ms: expected milliseconds, got "
                             f"{_shown(header)}") from None
        if not 0 < value < float("inf"):
            raise ValueError(f"X-Deadline-Ms: must be a positive number, got {_shown(header)}")
        values.append(value)
    return min(values) if values else None


def _min_version(request: Request, body: Any) -> Any:
    """``body`` with ``min_catalog_version`` raised to the ``X-Min-Catalog-Version`` header's
    (the larger of the two counts)."""
    header = request.headers.get("x-min-catalog-version")
    if header is None:
        return body
    digits = header.strip()
    # ASCII digits only ("\u00b2" is a digit to isdigit, not to int), and at most 19 of them
    # before int() (which refuses over 4300 digits with a message not naming the header)
    if (not (digits.isascii() and digits.isdigit()) or len(digits.lstrip("0")) > 19
            or int(digits) >= S.INT64_END):
        raise ValueError("X-Min-Catalog-Version: expected a catalog version, got "
                         f"{_shown(header)}")
    wanted = max(int(digits), body.min_catalog_version or 0)
    return body.model_copy(update={"min_catalog_version": wanted})


def add_routes(app: FastAPI, service: Service) -> None:
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


def add_probes(app: FastAPI, worker: BatchWorker, service: Service,
                metrics: ServerMetrics) -> None:
    """``/health``, ``/ready`` and ``/metrics``."""

    def engine_gone() -> JSONResponse | None:
        return None if worker.alive else error_response(503, "the engine process exited")

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
            return error_response(503, "draining")
        return JSONResponse({"status": "ready", "catalog_version": service.catalog_version()})

    @app.get("/metrics")
    async def prometheus() -> Response:
        """Prometheus metrics."""
        return Response(metrics.render(), media_type=metrics.content_type)
