"""The endpoints' logic, free of HTTP: each method checks one request alone (so that a bad
request is refused before it can join a batch), submits it to the batch scheduler and shapes
the answer. Bad input raises ``ValueError`` naming the body field (HTTP 422); a feature that
is not available raises :class:`ApiError` (HTTP 400).

A request's ``min_catalog_version`` (:mod:`genrec.serving.schemas`) is met before the request
is checked (:meth:`Service.caught_up`: a replica behind catches up from the shared log) and
checked again on the version its batch ran on: never an answer from an older catalog, an
:class:`CatalogBehindError` (503 with ``Retry-After``) instead.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from typing import Any

import torch

from genrec.catalog.assign import IdAssigner
from genrec.duolm.requests import RowRankRequest
from genrec.engine import RowRequest
from genrec.live_catalog.served import ServiceCatalog
from genrec.live_catalog.state import CatalogState
from genrec.serving import schemas as S
from genrec.serving.admission import Admission
from genrec.serving.api_errors import ApiError, CatalogBehindError
from genrec.serving.catalog_updates import CatalogUpdates
from genrec.serving.completions import item_text, parse_prompt
from genrec.serving.messages import RankBatch, RecommendBatch, ScoreBatch
from genrec.serving.scheduler import BatchScheduler
from genrec.serving.score_requests import encode_text, score_requests
from genrec.serving.worker import BatchWorker

CATCH_UP_S = 1.0  # longest wait for the catalog to reach a request's min_catalog_version


class Service:
    """The endpoints over ``worker`` (its engine, ranker and catalog check the requests) and
    the scheduler that runs the batches on it; ``tokenizer`` (optional) turns text of
    ``/v1/score`` into token ids, ``model_name`` is the answers' default ``model``;
    ``assigner`` gives catalog upserts without ``semantic_id`` theirs (default: from the
    codebooks saved with the engine's index, if any)."""

    def __init__(self, worker: BatchWorker, scheduler: BatchScheduler, tokenizer: Any = None,
                 model_name: str = "genrec", admission: Admission | None = None,
                 assigner: IdAssigner | None = None) -> None:
        self.worker, self.scheduler = worker, scheduler
        self.catalog_updates = CatalogUpdates(worker, scheduler, assigner)
        self.admission = admission or Admission(worker.engine)
        self.engine, self.ranker = worker.engine, worker.ranker
        self.tokenizer, self.model_name = tokenizer, model_name

    @property
    def catalog(self) -> ServiceCatalog | None:
        """The served catalog (generative catalog of the engine + the ranker's, through the
        updater) under one version number; None when nothing can be updated."""
        return self.worker.catalog

    def catalog_version(self) -> int:
        """The one catalog version of the service (both catalogs, every response, metrics)."""
        return self.worker.catalog_version

    async def caught_up(self, wanted: int | None, deadline_ms: float | None = None) -> None:
        """Return once the served catalog has version ``wanted`` or later (``None``: at once):
        a worker that follows a shared log (:meth:`~genrec.serving.worker.Worker.sync`) reads
        it now; waits at most :data:`CATCH_UP_S` (or ``deadline_ms``), else raises
        :class:`CatalogBehindError`."""
        if wanted is None or self.catalog_version() >= wanted:
            return
        limit = CATCH_UP_S if deadline_ms is None else min(CATCH_UP_S, deadline_ms / 1000.0)
        end = time.monotonic() + limit
        while True:
            await asyncio.to_thread(self.worker.sync, max(0.0, end - time.monotonic()))
            if self.catalog_version() >= wanted:
                return
            if time.monotonic() >= end:
                raise CatalogBehindError(wanted, self.catalog_version())
            await asyncio.sleep(0.005)

    @staticmethod
    def fresh(version: int, wanted: int | None) -> int:
        """``version`` (what an answer was computed on), checked against the request's
        ``min_catalog_version`` ``wanted``."""
        if wanted is not None and version < wanted:
            raise CatalogBehindError(wanted, version)
        return version

    # -- /v1/recommend -----------------------------------------------------------------------

    def _catalog(self) -> CatalogState:
        if self.engine.catalog is None:
            raise ApiError(400, "this model has no Semantic-ID vocabulary (not a generative "
                                "model): recommend and completions are unavailable")
        return self.engine.catalog

    def _check_user_vector(self, vector: Sequence[float] | None,
                           field: str = "user_vector") -> None:
        dim = self.engine.model.config.user_dim
        if vector is not None and len(vector) != dim:
            if dim == 0:
                raise ValueError(f"{field}: this model takes no user vector")
            raise ValueError(f"{field}: expected {dim} values, got {len(vector)}")

    def _recommend_request(self, history: list[int], user_vector: list[float] | None,
                           exclude: list[int] | None = None, allow: list[int] | None = None,
                           field: str = "history", text: list[int] | None = None
                           ) -> RowRequest:
        # ``history``, ``exclude`` and ``allow`` in rows (see :meth:`_rows`)
        self._catalog()
        if not history and user_vector is None and not text:
            raise ValueError(f"{field}: empty history and no user_vector")
        self._check_user_vector(user_vector)
        return RowRequest(history=history, user_vector=user_vector, exclude=exclude,
                                allow=allow, text=text)

    def _history(self, body: S.RecommendBody | S.RankBody, ignored: list[str]) -> list[int]:
        """The rows of a body's known ``history`` items (the unknown ones added to
        ``ignored``); raises ``ValueError`` when there were items and none is known, and the
        body has no user vector."""
        rows, unknown = self.worker.ids.known(body.history, "history")
        ignored.extend(unknown)
        if body.history and not rows and body.user_vector is None:
            raise ValueError(f"history: none of its {len(body.history)} items is in the "
                             f"catalog ({unknown[:10]}), and there is no user_vector: "
                             f"nothing to recommend from")
        return rows

    async def recommend(self, body: S.RecommendBody, deadline_ms: float | None) -> dict:
        """Top-n items by constrained beam search, or retrieve-then-rank with ``rerank``; the
        answer's ``ignored`` lists the ``history`` and ``exclude`` ids not in the catalog."""
        if body.n > body.beam_width:
            raise ValueError(f"n: {body.n} must not exceed beam_width ({body.beam_width})")
        if body.rerank and self.ranker is None:
            raise ApiError(400, "rerank: no ranker loaded")
        await self.caught_up(body.min_catalog_version, deadline_ms)
        ids, ignored = self.worker.ids, []
        history = self._history(body, ignored)
        exclude = None
        if body.exclude is not None:
            exclude, unknown = ids.known(body.exclude, "exclude")
            ignored.extend(unknown)
        allow = ids.rows(body.allow, "allow") if body.allow is not None else None
        request = self._recommend_request(history, body.user_vector, exclude, allow)
        n = body.beam_width if body.rerank else body.n
        self.admission.check(RecommendBatch(body.beam_width, n), request, "beam_width")
        for attempt in range(3):
            found = await self.scheduler.submit(RecommendBatch(body.beam_width, n), request,
                                                deadline_ms)
            rec = found.value
            version = self.fresh(found.catalog_version, body.min_catalog_version)
            if not body.rerank:
                return {"items": self.worker.ids.ids_of(rec.items), "scores": rec.scores,
                        "catalog_version": version, "ignored": ignored}
            try:
                return await self.rerank_retrieved(request, body, rec.items, ignored,
                                                   deadline_ms)
            except ValueError:
                # a catalog update between retrieval and ranking retired a retrieved item:
                # retrieve again from the new catalog
                if attempt == 2 or self.catalog_version() == version:
                    raise
        raise AssertionError("unreachable")

    async def rerank_retrieved(self, retrieved: RowRequest, body: S.RecommendBody,
                               items: list[int], ignored: list[str],
                               deadline_ms: float | None) -> dict:
        """Rerank hook: order the retrieved ``items`` (rows) by the ranker's scores for the
        user of ``retrieved``, keep ``body.n``."""
        if not items:
            return {"items": [], "scores": [], "catalog_version": self.catalog_version(),
                    "ignored": ignored}
        request = RowRankRequest(history=retrieved.history, candidates=items,
                              user_vector=body.user_vector)
        ranked = await self.scheduler.submit(RankBatch(), request, deadline_ms)
        values = torch.as_tensor(ranked.value, dtype=torch.float32).reshape(-1)
        top = torch.argsort(values, descending=True, stable=True)[: body.n].tolist()
        return {"items": self.worker.ids.ids_of(items[i] for i in top),
                "scores": [float(values[i]) for i in top], "ignored": ignored,
                "catalog_version": self.fresh(ranked.catalog_version,
                                              body.min_catalog_version)}

    # -- /v1/rank ----------------------------------------------------------------------------

    async def rank(self, body: S.RankBody, deadline_ms: float | None) -> dict:
        """Scores of the candidates by the ranker (one batched ``rank`` call per batch)."""
        if self.ranker is None:
            raise ApiError(400, "no ranker loaded")
        await self.caught_up(body.min_catalog_version, deadline_ms)
        ignored: list[str] = []
        history = self._history(body, ignored)
        candidates = self.worker.ids.rows(body.candidates, "candidates")
        request = RowRankRequest(history=history, candidates=candidates,
                              user_vector=body.user_vector)
        ranked = await self.scheduler.submit(RankBatch(), request, deadline_ms)
        version = self.fresh(ranked.catalog_version, body.min_catalog_version)
        values = torch.as_tensor(ranked.value, dtype=torch.float32).reshape(-1).tolist()
        if len(values) != len(body.candidates):
            raise RuntimeError(f"ranker returned {len(values)} scores for "
                               f"{len(body.candidates)} candidates")
        return {"scores": values, "catalog_version": version, "ignored": ignored}

    # -- /v1/score ---------------------------------------------------------------------------

    async def score(self, body: S.ScoreBody, deadline_ms: float | None) -> dict:
        """SGLang ``/v1/score``: label probabilities (or softmax over the labels) per item."""
        await self.caught_up(body.min_catalog_version, deadline_ms)
        requests, shared, n_tokens = score_requests(self.engine, self.tokenizer, body)
        scores: list[list[float]] = []
        version = self.catalog_version()
        if requests:
            message = ScoreBatch(tuple(body.label_token_ids), body.apply_softmax)
            self.admission.check(message, requests, "items")
            result = await self.scheduler.submit(message, requests, deadline_ms)
            values = torch.cat(result.value, dim=0)
            scores = (values if body.apply_softmax else values.exp()).tolist()
            version = result.catalog_version
        version = self.fresh(version, body.min_catalog_version)
        return {"scores": scores, "model": body.model or self.model_name,
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
                "meta_info": {"prompt_tokens": n_tokens, "num_items": len(scores),
                              "shared_prefix": shared, "catalog_version": version}}

    # -- /v1/completions ---------------------------------------------------------------------

    async def complete(self, body: S.CompletionBody, deadline_ms: float | None) -> dict:
        """OpenAI completions subset: beam search only, one catalog item per choice."""
        if body.stream:
            raise ApiError(400, "stream: streaming is not supported")
        if not body.use_beam_search:
            raise ApiError(400, "use_beam_search: only constrained beam search is supported "
                                "(set use_beam_search: true); sampling is not")
        await self.caught_up(body.min_catalog_version, deadline_ms)
        levels = self._catalog().num_levels
        best_of = body.best_of if body.best_of is not None else body.n
        if body.n > best_of:
            raise ValueError(f"n: {body.n} must not exceed best_of ({best_of})")
        if body.max_tokens is not None and body.max_tokens < levels:
            raise ValueError(f"max_tokens: one item takes {levels} tokens, got {body.max_tokens}")
        history, text = parse_prompt(self._catalog(), body.prompt, body.user_vector,
                                     lambda t: encode_text(self.tokenizer, t, "prompt", False))
        request = self._recommend_request(history, body.user_vector, field="prompt", text=text)
        self.admission.check(RecommendBatch(best_of, body.n), request, "best_of")
        found = await self.scheduler.submit(RecommendBatch(best_of, body.n), request,
                                            deadline_ms)
        rec, version = found.value, self.fresh(found.catalog_version, body.min_catalog_version)
        catalog, names = self._catalog(), self.worker.ids.ids_of(rec.items)
        choices = [{"index": k, "text": item_text(catalog, item), "item_id": name,
                    "score": score, "logprobs": None, "finish_reason": "length"}
                   for k, (item, name, score) in enumerate(zip(rec.items, names, rec.scores,
                                                               strict=True))]
        n_prompt = len(body.prompt) if isinstance(body.prompt, list) else (
            len(history) * levels + len(text or ()))
        n_out = levels * len(choices)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()),
                "model": body.model or self.model_name, "choices": choices,
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                          "total_tokens": n_prompt + n_out}, "catalog_version": version}

    # -- /v1/catalog/items -------------------------------------------------------------------

    async def update_catalog(self, op: str, payload: list, deadline_ms: float | None) -> dict:
        """``op`` 'upsert' (item dicts) or 'retire' (item ids), all or nothing: see
        :meth:`genrec.serving.catalog_updates.CatalogUpdates.update`."""
        return await self.catalog_updates.update(op, payload, deadline_ms)
