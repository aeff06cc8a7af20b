"""The public engine: ``Engine(model).score(...)`` (multi-item scoring) and
``.recommend(...)`` (generative retrieval), each prepared on the host, then run."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import torch

from genrec.catalog.id_map import IdMap
from genrec.catalog.item_table import ItemTable
from genrec.engine.engine_config import EngineConfig
from genrec.engine.inputs import InputError
from genrec.engine.item_ranking import HeadPool, pool_with_head, rank_with_head
from genrec.engine.params import DEFAULT_ITEM_WEIGHT, BeamParams, saved_item_weight
from genrec.engine.request_ids import ServedCatalog, to_ids, to_rows
from genrec.engine.requests import (
    Recommendation,
    RecommendRequest,
    RowRecommendation,
    RowRequest,
)
from genrec.engine.retrieval import (
    PreparedSearch,
    prepare_search,
    run_search,
    top_items,
)
from genrec.engine.scoring_engine import ScoringEngine
from genrec.live_catalog.state import CatalogState
from genrec.model.checkpoint import load_model
from genrec.model.decoder import DecoderLM
from genrec.vocab.sid_vocab import SidVocab


class Engine(ScoringEngine):
    """Serves a decoder LM for recommendation: multi-item scoring on a shared prefix
    (:meth:`score`, from :class:`ScoringEngine`) and generative retrieval by constrained beam
    search (:meth:`recommend`).

    The engine holds no per-request state: a rejected request leaves it as it was. Its beam
    searches reuse static buffers (:attr:`searches`), one search at a time, kept within half
    of :attr:`memory`, the memory budget taken when the engine is built
    (:mod:`genrec.engine.memory`).
    """

    def __init__(
        self, model: DecoderLM, item_table: ItemTable | None = None,
        config: EngineConfig | None = None, vocab: SidVocab | None = None,
    ) -> None:
        self._served: ServedCatalog | None = None  # the generative catalog, swapped whole
        super().__init__(model, item_table, config)
        if vocab is not None:
            self.set_vocab(vocab)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, dtype: str | torch.dtype | None = None,
        device: str | torch.device = "cpu", config: EngineConfig | None = None,
    ) -> Engine:
        """Load a checkpoint directory (strictly) onto ``device`` in ``dtype``; a generative
        model's Semantic-ID vocabulary saved beside it is loaded too, and its item weight
        (``generation_config.json``) where ``config`` sets none."""
        vocab = SidVocab.load(path) if SidVocab.exists(path) else None
        if vocab is not None and config is None:
            config = EngineConfig(soft_token_id=vocab.soft_id)
        config = config or EngineConfig()
        if config.item_weight is None:
            config = dataclasses.replace(config, item_weight=saved_item_weight(path))
        return cls(load_model(path, dtype=dtype, device=device), config=config, vocab=vocab)

    @property
    def vocab(self) -> SidVocab | None:
        """The installed Semantic-ID vocabulary (of :attr:`catalog`), or ``None``."""
        catalog = self.catalog
        return catalog.vocab if catalog is not None else None

    def set_vocab(self, vocab: SidVocab) -> None:
        """Install the Semantic-ID vocabulary (every item live) and build its trie on the
        model's device."""
        version = self.catalog.version + 1 if self.catalog is not None else 0
        self._check_tokens(vocab.vocab_size)
        self.set_catalog(CatalogState.build(vocab, self.model.device, version=version))

    def set_catalog(self, catalog: CatalogState, ids: IdMap | None = None) -> None:
        """Install a generative catalog state (see :meth:`CatalogState.updated`) in one swap:
        a :meth:`recommend` call reads the state once, so it uses the old catalog or the new
        one throughout. ``ids``: the table's ids of its rows (default: its index's
        ``item_ids``, made on the first :meth:`recommend`; see :attr:`ids`)."""
        self._check_tokens(catalog.token_count)
        self._served = ServedCatalog(catalog, ids)

    @property
    def catalog(self) -> CatalogState | None:
        """The installed generative catalog state, or ``None`` (not a generative model)."""
        served = self._served
        return served.state if served is not None else None

    @property
    def ids(self) -> IdMap:
        """The table's item ids of :attr:`catalog`'s rows: the ids of :meth:`recommend`."""
        return self._generative().ids

    def _generative(self) -> ServedCatalog:
        served = self._served
        if served is None:
            raise ValueError("this engine has no Semantic-ID vocabulary (not a generative model)")
        return served

    def _check_tokens(self, needed: int) -> None:
        if needed > self.model.config.vocab_size:
            raise ValueError(
                f"Semantic-ID vocabulary needs {needed} tokens, the model has "
                f"{self.model.config.vocab_size}"
            )

    def recommend(
        self, requests: Sequence[RecommendRequest], params: BeamParams | None = None,
    ) -> list[Recommendation]:
        """Top-n catalog items per request by constrained beam search (all requests batched),
        items named by the catalog's ids (:attr:`ids`; an integer names its decimal string).

        Every returned item is a live (not retired) catalog item allowed by the request's
        filters; fewer than n come back only when fewer items are allowed. Unknown
        ``history`` and ``exclude`` ids are left out and listed in the answer's ``ignored``;
        an unknown ``allow`` id raises ``InputError`` (a ``ValueError``) naming the field.
        """
        served = self._generative()  # the catalog and its ids, read once
        rows, ignored = to_rows(requests, served.ids)
        return to_ids(self.recommend_rows(rows, params, served.state), served.ids, ignored)

    def recommend_rows(
        self, requests: Sequence[RowRequest], params: BeamParams | None = None,
        catalog: CatalogState | None = None,
    ) -> list[RowRecommendation]:
        """:meth:`recommend` in the catalog's rows (what a server, the batch job and
        evaluation call once they hold rows). ``catalog``: the catalog state to search
        (default: the installed one, read once at the start)."""
        return self.run_recommend(self.prepare_recommend(requests, params, catalog))

    def prepare_recommend(
        self, requests: Sequence[RowRequest], params: BeamParams | None = None,
        catalog: CatalogState | None = None,
    ) -> PreparedSearch:
        """The host part of :meth:`recommend_rows`: checks (``InputError`` naming the field),
        prompts, packing, filters, against ``catalog`` (default: the installed one, read
        now). :meth:`run_recommend` runs it; a server packs the next batch meanwhile."""
        catalog = catalog if catalog is not None else self.catalog
        if catalog is None:
            raise ValueError("this engine has no Semantic-ID vocabulary (not a generative model)")
        params = params or BeamParams()
        params.validate()
        if params.item_weight is None:
            params = dataclasses.replace(params, item_weight=self.item_weight)
        if not requests:
            raise InputError("requests: empty request list")
        return prepare_search(requests, params, catalog, self.request_limits(self.item_table))

    @property
    def item_weight(self) -> float:
        """The item head's weight in ranking for requests that give none
        (:attr:`EngineConfig.item_weight`, else :data:`DEFAULT_ITEM_WEIGHT`)."""
        w = self.config.item_weight
        return DEFAULT_ITEM_WEIGHT if w is None else w

    def run_recommend(self, prepared: PreparedSearch) -> list[RowRecommendation]:
        """The search of a :meth:`prepare_recommend` batch (one at a time per engine); a
        model with an item head ranks the beam's proposals and its own with it
        (:mod:`genrec.engine.item_ranking`)."""
        batch, params, model = prepared.batch, prepared.params, self.model
        items, scores = run_search(prepared, self.searches, self.embed(batch), model.device)
        if model.item_head is not None and params.item_weight:
            return rank_with_head(self.score_requests, model, self.embed(batch), prepared,
                                  items, scores)
        return top_items(items, scores, params.n)

    def head_pools(
        self, requests: Sequence[RowRequest], params: BeamParams | None = None,
        catalog: CatalogState | None = None,
    ) -> list[HeadPool]:
        """A model with an item head: each request's pooled proposals with their Semantic-ID
        and head scores, from one search. ``pool.rank(w, params.n)`` is what
        :meth:`recommend_rows` returns with ``item_weight`` w > 0 (the pool does not depend on
        w): what choosing an item weight needs."""
        model = self.model
        if model.item_head is None:
            raise ValueError("head_pools: the model has no item head")
        prepared = self.prepare_recommend(requests, params, catalog)
        batch = prepared.batch
        items, scores = run_search(prepared, self.searches, self.embed(batch), model.device)
        return pool_with_head(self.score_requests, model, self.embed(batch), prepared, items,
                              scores)
