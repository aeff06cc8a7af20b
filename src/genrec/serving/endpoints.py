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
import itertools
import time
import uuid
from collections.abc import Sequence
from typing import Any

import torch

from genrec.catalog.assign import IdAssigner, assign_upserts
from genrec.catalog.id_map import item_keys
from genrec.engine import RowRequest, ScoreRequest
from genrec.live_catalog.served import ServiceCatalog
from genrec.live_catalog.state import CatalogState
from genrec.live_catalog.update_plan import CatalogChange, PreparedUpdate
from genrec.serving import schemas as S
from genrec.serving.admission import Admission
from genrec.serving.backends import RankRequest
from genrec.serving.completions import item_text, parse_prompt
from genrec.serving.messages import CatalogOp, CatalogUpdate, RankBatch, RecommendBatch, ScoreBatch
from genrec.serving.scheduler import BatchScheduler
from genrec.serving.worker import BatchWorker

CATCH_UP_S = 1.0  # longest wait for the catalog to reach a request's min_catalog_version


class ApiError(Exception):
    """A request the server cannot serve as configured: HTTP ``status_code`` with ``detail``."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(detail)
        self.status_code, self.detail = status_code, detail


class CatalogBehindError(RuntimeError):
    """The served catalog has not reached a request's ``min_catalog_version`` in time: retry
    later (HTTP 503 with ``Retry-After``; ``/metrics`` counts it as ``catalog_behind``)."""

    def __init__(self, wanted: int, version: int) -> None:
        super().__init__(f"min_catalog_version: {wanted} not reached here yet (catalog "
                         f"version {version}); retry")


def prepare(catalog: ServiceCatalog, op: str, data: list) -> PreparedUpdate | CatalogOp:
    """The update built on the installed catalog (:meth:`ServiceCatalog.prepare`); following
    a shared log, an update refused there goes as it is, to be decided on the log's newest
    catalog (another replica's update may have made it valid)."""
    try:
        return catalog.prepare(op, data)
    except ValueError:
        if not catalog.follows:
            raise
        return CatalogOp(op, data)


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
        catalog = worker.engine.catalog
        if assigner is None and catalog is not None:
            assigner = IdAssigner.of(catalog.base_vocab.index)
        self.assigner = assigner
        self.admission = admission or Admission(worker.engine)
        self.engine, self.ranker = worker.engine, worker.ranker
        self.tokenizer, self.model_name = tokenizer, model_name
        self._seq = itertools.count()
        self._updating = asyncio.Lock()  # updates prepared and queued one at a time, in order

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
        request = RankRequest(history=retrieved.history, candidates=items,
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
        request = RankRequest(history=history, candidates=candidates,
                              user_vector=body.user_vector)
        ranked = await self.scheduler.submit(RankBatch(), request, deadline_ms)
        version = self.fresh(ranked.catalog_version, body.min_catalog_version)
        values = torch.as_tensor(ranked.value, dtype=torch.float32).reshape(-1).tolist()
        if len(values) != len(body.candidates):
            raise RuntimeError(f"ranker returned {len(values)} scores for "
                               f"{len(body.candidates)} candidates")
        return {"scores": values, "catalog_version": version, "ignored": ignored}

    # -- /v1/score ---------------------------------------------------------------------------

    def _tokens(self, text: str, field: str, special: bool) -> list[int]:
        if self.tokenizer is None:
            raise ApiError(400, f"{field}: text input needs a tokenizer (start the server with "
                                f"--tokenizer DIR), or send token ids")
        return list(self.tokenizer.encode(text, add_special_tokens=special))

    def _check_ids(self, ids: list[int], field: str) -> None:
        engine = self.engine
        limit = engine.model.config.vocab_size
        if engine.item_table is not None:
            limit += engine.item_table.num_rows
        bad = [t for t in ids if t >= limit]
        if bad:
            raise ValueError(f"{field}: token id {bad[0]} is out of range (0..{limit - 1})")

    def score_requests(self, body: S.ScoreBody) -> tuple[list[ScoreRequest], bool, int]:
        """The engine requests of a score body, whether they share the query as prefix, and
        the number of prompt tokens."""
        items = [body.items] if isinstance(body.items, str) else list(body.items)
        text_query = isinstance(body.query, str) and body.query != ""
        text_items = any(isinstance(i, str) for i in items)
        if text_query and items and not text_items:
            raise ValueError("query: query is text but items are token ids (give both as text "
                             "or both as token ids)")
        query = (self._tokens(body.query, "query", not body.item_first) if text_query
                 else list(body.query or []))
        if text_items:
            items = [self._tokens(t, f"items[{i}]", body.item_first) for i, t in enumerate(items)]
        vocab_size = self.engine.model.config.vocab_size
        bad = [t for t in body.label_token_ids if t >= vocab_size]
        if bad:
            raise ValueError(f"label_token_ids: {bad[0]} is not a text token "
                             f"(0..{vocab_size - 1})")
        self._check_ids(query, "query")
        max_pos = self.engine.model.config.max_position_embeddings
        for i, item in enumerate(items):
            self._check_ids(item, f"items[{i}]")
            if len(query) + len(item) > max_pos:
                raise ValueError(f"items[{i}]: query + item ({len(query) + len(item)} tokens) "
                                 f"exceed the model's {max_pos} positions")
        n_tokens = len(query) + sum(len(i) for i in items)
        if not items:
            return [], False, 0
        if query and not body.item_first and all(items):
            return [ScoreRequest(prefix=query, candidates=items)], True, n_tokens
        requests = []  # no shared prefix: each sequence alone, scored at its last token
        for i, item in enumerate(items):
            seq = item + query if body.item_first else query + item
            if not seq:
                raise ValueError(f"items[{i}]: empty item and empty query")
            requests.append(ScoreRequest(prefix=seq[:-1], candidates=[seq[-1:]]))
        return requests, False, n_tokens + (len(query) * (len(items) - 1))

    async def score(self, body: S.ScoreBody, deadline_ms: float | None) -> dict:
        """SGLang ``/v1/score``: label probabilities (or softmax over the labels) per item."""
        await self.caught_up(body.min_catalog_version, deadline_ms)
        requests, shared, n_tokens = self.score_requests(body)
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
                                     lambda t: self._tokens(t, "prompt", False))
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
        """``op`` 'upsert' (item dicts) or 'retire' (item ids), all or nothing over the
        generative catalog and the ranker's (see :mod:`genrec.live_catalog.served`), run on the
        engine's worker thread between batches, so no batch sees a half-updated catalog.

        Upsert items with a ``semantic_id`` join the generative catalog; items without one, or
        with ranker fields (``text``, ``vectors``), go to the ranker. An item without
        ``semantic_id`` that gives ``embedding`` (or ``text`` the index's encoder embeds, see
        :func:`~genrec.catalog.assign.assign_upserts`) is given one by the index's codebooks,
        then upserted with it like any other: the answer's ``semantic_ids`` lists them. The
        answer's ``catalogs`` names which catalogs took which item ids.
        """
        catalog = self.catalog
        if catalog is None:
            raise ApiError(400, "no catalog updater")
        if op not in ("upsert", "retire"):
            raise RuntimeError(f"unknown catalog operation {op!r}")
        data, assigned = list(payload), {}
        async with self._updating:  # IDs assigned against the catalog the update runs on
            if op == "upsert":
                data = [{k: v for k, v in it.items()
                         if k not in ("semantic_id", "embedding") or v is not None}
                        for it in payload]
                data, assigned = await asyncio.to_thread(self._assigned, data)
                try:
                    catalog.check(data)
                    catalog.split(data)
                except LookupError as err:
                    raise ApiError(400, str(err)) from None
            # built beside the batches: the worker only swaps it in
            prepared = await asyncio.to_thread(prepare, catalog, op, data)
            change: CatalogChange = await self.scheduler.submit(
                CatalogUpdate(next(self._seq)), prepared, deadline_ms)
        return {"catalog_version": change.version, "count": len(payload),
                "catalogs": change.catalogs, "semantic_ids": assigned or None}

    def _assigned(self, items: list[dict]) -> tuple[list[dict], dict[str, list[int]]]:
        # upsert items with the Semantic IDs the index's codebooks give (assign_upserts)
        state = self.engine.catalog
        if state is None:
            for k, item in enumerate(items):
                if "embedding" in item:
                    raise ValueError(f"items[{k}].embedding: this model has no Semantic-ID "
                                     f"vocabulary (not a generative model)")
            return items, {}
        rows = self.worker.ids.find(item_keys([it["item_id"] for it in items], "items")).tolist()
        return assign_upserts(items, self.assigner, state.lookup, rows,
                              ranker=self.catalog.ranker_updater is not None)
