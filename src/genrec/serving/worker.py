"""What runs the batches: the engine, the ranker and the served catalog under one catalog
version, with one method per message kind (:mod:`genrec.serving.messages`).

The batch scheduler's runner is :meth:`Worker.run` (or the same method of an engine-process
proxy, :class:`~genrec.serving.engine_process.EngineProcess`): it is called on the
scheduler's worker thread only, so a catalog update never runs during a batch and each batch
reads one catalog version. A catalog that follows a shared state directory
(:mod:`genrec.live_catalog.follow`) is caught up under the same rule: a poller thread
notices the log grew; the catch-up runs before the next batch, or at once when no batch runs
(:meth:`Worker.sync`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from genrec.catalog.id_map import IdMap
from genrec.duolm.requests import RowRankRequest
from genrec.engine import (
    BeamParams,
    Engine,
    RowRecommendation,
    RowRequest,
    ScoreParams,
    ScoreRequest,
)
from genrec.engine.ensemble import Ensemble
from genrec.live_catalog.compaction import CatalogStats
from genrec.live_catalog.follow import POLL_S, LogPoller
from genrec.live_catalog.ids import model_ids
from genrec.live_catalog.served import ServiceCatalog
from genrec.live_catalog.update_plan import CatalogChange, PreparedUpdate
from genrec.serving.backends import CatalogUpdater, Ranker
from genrec.serving.messages import (
    CatalogOp,
    CatalogUpdate,
    Message,
    RankBatch,
    RecommendBatch,
    ScoreBatch,
    Versioned,
)


@dataclass(frozen=True)
class PreparedBatch:
    """A batch after :meth:`Worker.prepare`: its message and payloads, the catalog version
    its results carry and the engine's prepared work (``None``: runs whole when finished)."""

    message: Message
    payloads: list[Any]
    version: int | None
    work: Any


class BatchWorker(Protocol):
    """What the server runs batches on: a :class:`Worker`, or a proxy running them in another
    process. ``engine``, ``ranker`` and ``catalog`` are this process's (requests are checked
    against them before they are queued); ``catalog_version`` is the one version of the
    service; ``alive``: whether batches can run."""

    @property
    def engine(self) -> Engine: ...

    @property
    def ranker(self) -> Ranker | None: ...

    @property
    def catalog(self) -> ServiceCatalog | None: ...

    @property
    def catalog_version(self) -> int: ...

    @property
    def ids(self) -> IdMap: ...

    @property
    def alive(self) -> bool: ...

    def run(self, message: Message, payloads: list[Any]) -> Sequence[Any]:
        """One result per payload, in order (see :mod:`genrec.serving.messages`)."""
        ...

    def sync(self, timeout_s: float | None = None) -> int:
        """Catch a catalog that follows a shared log up to it now; the version served."""
        ...

    def catalog_stats(self) -> CatalogStats | None:
        """The generative catalog of the engine that searches (``None``: none)."""
        ...

    def close(self) -> None:
        """Release what it holds (background compaction, child process)."""
        ...


def initial_version(engine: Engine, ranker: Ranker | None) -> int:
    """The catalog version a server starts at: the ranker's, else the engine's item table's,
    else its generative catalog's, else 0."""
    if ranker is not None:
        return int(ranker.catalog_version)
    if engine.item_table is not None:
        return engine.item_table.version
    return engine.catalog.version if engine.catalog is not None else 0


class Worker:
    """The engine, an optional ranker and the served catalog (a
    :class:`~genrec.live_catalog.served.ServiceCatalog` over the engine's generative catalog and
    the optional ``catalog_updater``; ``None`` when there is nothing to update).

    ``compact_threshold``: see :class:`~genrec.live_catalog.served.ServiceCatalog`. ``ensemble``:
    recommend with it (its first member is ``engine``, whose catalog every member reads).
    """

    def __init__(self, engine: Engine, ranker: Ranker | None = None,
                 catalog_updater: CatalogUpdater | None = None,
                 compact_threshold: int | None = None,
                 ensemble: Ensemble | None = None) -> None:
        if ensemble is not None and ensemble.engines[0] is not engine:
            raise ValueError("ensemble: its first member must be the served engine")
        self.engine, self.ranker = engine, ranker
        self.recommender: Engine | Ensemble = ensemble if ensemble is not None else engine
        # every engine whose graphs a batch may capture: preparing the next batch (device
        # copies) waits while any of them captures
        self._engines = list(ensemble.engines) if ensemble is not None else [engine]
        self.catalog: ServiceCatalog | None = None
        if isinstance(catalog_updater, ServiceCatalog):
            self.catalog = catalog_updater
        elif catalog_updater is not None or engine.catalog is not None:
            self.catalog = ServiceCatalog(engine, catalog_updater,
                                          initial_version(engine, ranker), compact_threshold,
                                          ids=model_ids(engine, ranker))
        # the table's ids of a server with nothing to update (a ranker alone)
        self._ids = model_ids(engine, ranker) if self.catalog is None else None
        self._handlers: dict[type, Callable[[Any, list[Any]], list[Any]]] = {
            RecommendBatch: self.recommend, ScoreBatch: self.score, RankBatch: self.rank,
            CatalogUpdate: self.update_catalog,
        }
        self._batch = threading.Lock()  # held for each batch: catch-ups run between them
        self._behind = False  # the followed log grew: catch up before the next batch
        self._poller = None
        if self.catalog is not None and self.catalog.follows:
            self._poller = LogPoller(self.catalog.follower.tail.changed, self._log_grew)

    @property
    def catalog_version(self) -> int:
        """The one catalog version of the service (both catalogs, every response, metrics)."""
        if self.catalog is not None:
            return self.catalog.catalog_version
        return initial_version(self.engine, self.ranker)

    @property
    def ids(self) -> IdMap:
        """The table's item ids of the catalog served now (see :class:`IdMap`)."""
        return self.catalog.ids if self.catalog is not None else self._ids

    @property
    def alive(self) -> bool:
        """Always: the batches run in this process."""
        return True

    def run(self, message: Message, payloads: list[Any]) -> list[Any]:
        """The batch of ``message``'s kind: one result per payload. Raises ``TypeError`` for
        an unknown message."""
        handler = self._handlers.get(type(message))
        if handler is None:
            raise TypeError(f"unknown message {message!r}")
        with self._batch:
            self._catch_up_if_behind()
            return handler(message, payloads)

    def _catch_up_if_behind(self) -> None:
        # under the batch lock: the followed log grew since the last batch
        if self._behind:
            self._behind = False
            # a log that cannot be read fails no batch: the poller reports it, and retries
            with contextlib.suppress(Exception):
                self.catalog.catch_up()

    def _log_grew(self) -> None:
        self._behind = True
        self.sync(POLL_S)

    def sync(self, timeout_s: float | None = None) -> int:
        """Catch the followed catalog up to its log now, between batches (waiting up to
        ``timeout_s`` for a running batch; after it, the next batch catches up first);
        returns the version served."""
        if self._poller is None:
            return self.catalog_version
        if not self._batch.acquire(timeout=-1 if timeout_s is None else timeout_s):
            return self.catalog_version
        try:
            self._behind = False
            return self.catalog.catch_up()
        finally:
            self._batch.release()

    def recommend(self, message: RecommendBatch, requests: list[RowRequest]
                  ) -> list[Versioned[RowRecommendation]]:
        """Constrained beam search for every request, in one engine call."""
        return self._finish_work(self.prepare(message, requests))

    def score(self, message: ScoreBatch, requests: list[list[ScoreRequest]]
              ) -> list[Versioned[list[torch.Tensor]]]:
        """Label scores of every HTTP request's scoring requests, in one engine call."""
        return self._finish_work(self.prepare(message, requests))

    # -- two steps (overlap scheduling: the next batch is prepared while this one runs) -------

    def prepare(self, message: Message, payloads: list[Any]) -> PreparedBatch:
        """The host part of a batch (checks, prompts, packing; ``InputError`` for bad input)
        against one catalog version, read now; :meth:`finish` runs it. Recommend and score
        batches are prepared; others run whole in :meth:`finish`."""
        if type(message) not in self._handlers:
            raise TypeError(f"unknown message {message!r}")
        with contextlib.ExitStack() as held:  # no device work while a graph is captured
            for engine in self._engines:  # always in this order: no lock cycle
                held.enter_context(engine.searches.capture_lock)
            return self._prepare(message, payloads)

    def _prepare(self, message: Message, payloads: list[Any]) -> PreparedBatch:
        if isinstance(message, RecommendBatch):
            version, state = (self.catalog.snapshot() if self.catalog is not None
                              else (self.catalog_version, None))
            params = BeamParams(beam_width=message.beam_width, n=message.n)
            work = self.recommender.prepare_recommend(payloads, params, state)
        elif isinstance(message, ScoreBatch):
            version = self.catalog_version
            params = ScoreParams(mode="labels", label_token_ids=list(message.label_token_ids),
                                 apply_softmax=message.apply_softmax)
            work = self.engine.prepare_score([r for group in payloads for r in group], params)
        else:
            return PreparedBatch(message, payloads, None, None)
        return PreparedBatch(message, payloads, version, work)

    def finish(self, prepared: PreparedBatch) -> list[Any]:
        """Run a batch from :meth:`prepare`: one result per payload (see :meth:`run`)."""
        if prepared.work is None:
            return self.run(prepared.message, prepared.payloads)
        with self._batch:
            self._catch_up_if_behind()
            return self._finish_work(prepared)

    @staticmethod
    def barrier(prepared: PreparedBatch) -> bool:
        """Whether ``prepared`` must finish before the next batch is prepared (a catalog
        update: later batches read the catalog it makes)."""
        return isinstance(prepared.message, CatalogUpdate)

    def _finish_work(self, prepared: PreparedBatch) -> list[Any]:
        version = prepared.version
        if isinstance(prepared.message, RecommendBatch):
            return [Versioned(rec, version)
                    for rec in self.recommender.run_recommend(prepared.work)]
        scores = self.engine.run_score(prepared.work)
        out, start = [], 0
        for group in prepared.payloads:
            out.append(Versioned(scores[start:start + len(group)], version))
            start += len(group)
        return out

    def rank(self, message: RankBatch, requests: list[RowRankRequest]
             ) -> list[Versioned[torch.Tensor]]:
        """The ranker's scores of every request's candidates, in one call."""
        if self.ranker is None:
            raise RuntimeError("no ranker loaded")
        version = self.catalog_version
        return [Versioned(scores, version) for scores in self.ranker.rank_rows(requests)]

    def update_catalog(self, message: CatalogUpdate,
                       updates: list[CatalogOp | PreparedUpdate]) -> list[CatalogChange]:
        """Apply the updates to the served catalog, all or nothing each, in order."""
        if self.catalog is None:
            raise RuntimeError("no service catalog to update")
        return [self.catalog.apply(u if isinstance(u, PreparedUpdate) else (u.op, u.data))
                for u in updates]

    def catalog_stats(self) -> CatalogStats | None:
        """The generative catalog's delta and finished compactions (``None``: none)."""
        if self.catalog is None or not self.catalog.generative:
            return None
        return self.catalog.stats()

    def close(self) -> None:
        """Stop following the log; start no more compactions (a running one is waited for
        briefly, not installed)."""
        if self._poller is not None:
            self._poller.close()
        if self.catalog is not None:
            self.catalog.close()
