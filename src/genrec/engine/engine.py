"""The public engine: ``Engine(model).score(...)`` (multi-item scoring) and
``.recommend(...)`` (generative retrieval), each prepared on the host, then run."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Sequence
from pathlib import Path

import torch

from genrec.catalog.id_map import IdMap
from genrec.catalog.item_table import ItemTable
from genrec.engine.batch import (
    PackedBatch,
    RequestLimits,
    item_rows,
    pack_requests,
    token_groups,
)
from genrec.engine.beam_runner import RunnerPool, runner_config
from genrec.engine.chunked import forward_chunked
from genrec.engine.engine_config import EngineConfig
from genrec.engine.inputs import InputError, Part, build_input_embeds
from genrec.engine.item_ranking import HeadPool, pool_with_head, rank_with_head
from genrec.engine.memory import take_budget
from genrec.engine.params import DEFAULT_ITEM_WEIGHT, BeamParams, ScoreParams, saved_item_weight
from genrec.engine.request_ids import ServedCatalog, to_ids, to_rows
from genrec.engine.requests import (
    Recommendation,
    RecommendRequest,
    RowRecommendation,
    RowRequest,
    ScoreRequest,
)
from genrec.engine.retrieval import (
    PreparedSearch,
    prepare_search,
    run_search,
    top_items,
)
from genrec.engine.score_runner import ScoreRunnerPool
from genrec.engine.scoring import PreparedScore, read_scores
from genrec.kernels import cascade_attention_op
from genrec.live_catalog.state import CatalogState
from genrec.model.checkpoint import load_model
from genrec.model.decoder import DecoderLM
from genrec.utils.allocator import keep_freed_memory
from genrec.utils.device_lock import DeviceLock
from genrec.vocab.sid_vocab import SidVocab


class Engine:
    """Serves a decoder LM for recommendation: multi-item scoring on a shared prefix
    (:meth:`score`) and generative retrieval by constrained beam search (:meth:`recommend`).

    The engine holds no per-request state: a rejected request leaves it as it was. Its beam
    searches reuse static buffers (:attr:`searches`), one search at a time, kept within half
    of :attr:`memory`, the memory budget taken when the engine is built
    (:mod:`genrec.engine.memory`).
    """

    def __init__(
        self, model: DecoderLM, item_table: ItemTable | None = None,
        config: EngineConfig | None = None, vocab: SidVocab | None = None,
    ) -> None:
        self.model = model.eval()
        self.config = config or EngineConfig()
        if self.model.device.type == "cpu":
            keep_freed_memory()  # activations reused across forwards, not re-faulted
            cascade_attention_op()  # built (once per machine) now, not in the first request
        self.item_table: ItemTable | None = None
        self._served: ServedCatalog | None = None  # the generative catalog, swapped whole
        # taken once, after the weights are on the device (logged)
        self.memory = take_budget(self.model.device, self.config.memory_fraction,
                                  self.config.memory_budget_bytes)
        self.searches = RunnerPool(self.model, runner_config(self.config, self.model.device,
                                                             self.memory))
        # scoring grids share the searches' settings, capture lock and graph pool; on by
        # default on CUDA only (on the CPU the packed path is faster)
        on = self.config.score_runners
        self.scorers = ScoreRunnerPool(self.model, self.searches,
                                       on if on is not None else self.model.device.type == "cuda")
        if item_table is not None:
            self.set_item_table(item_table)
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
        return prepare_search(requests, params, catalog, self._limits(self.item_table))

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

    def pack(
        self, prefixes: Sequence[Part], branches: Sequence[Sequence[Part]],
        user_vectors: Sequence[object | None], require_branches: bool = True,
        item_table: ItemTable | None = None,
    ) -> PackedBatch:
        """Validate and pack requests against this engine's model and ``item_table``
        (default: the installed one)."""
        return pack_requests(prefixes, branches, user_vectors,
                             self._limits(item_table or self.item_table),
                             require_branches=require_branches)

    def embed(self, batch: PackedBatch, item_table: ItemTable | None = None) -> torch.Tensor:
        """Input embeddings [T, hidden] of a packed batch, on the model's device."""
        model = self.model
        return build_input_embeds(
            model.model.embed_tokens, batch.inputs, item_table or self.item_table,
            model.user_projector, model.item_head,
        )

    def device_work(self) -> DeviceLock:
        """The lock of the engine's device (a context manager): hold it around device work
        that may run beside the engine's batches, so that it never overlaps a CUDA graph
        capture (:mod:`genrec.utils.device_lock`)."""
        return self.searches.capture_lock

    def held_bytes(self) -> int:
        """Bytes the engine keeps between calls: its search buffers and scoring grids."""
        return self.searches.stats().bytes + self.scorers.nbytes()

    def release_caches(self) -> None:
        """Drop the kept search buffers, scoring grids and their graphs, and hand the freed
        device memory back (after an out-of-memory error; the next call makes them again)."""
        self.searches.release()
        self.scorers.release()
        gc.collect()
        if self.model.device.type == "cuda":
            torch.cuda.empty_cache()

    def set_item_table(self, table: ItemTable) -> None:
        """Install an item table (moved to the model's device and dtype) in one swap.

        Each scoring call reads the installed table once, so a call running during a swap
        uses the old table or the new one throughout, never a mix.
        """
        self.item_table = self.prepare_table(table)

    def prepare_table(self, table: ItemTable) -> ItemTable:
        """``table`` checked against the model and moved to its device and dtype."""
        if table.hidden_size != self.model.config.hidden_size:
            raise ValueError(
                f"item table hidden size {table.hidden_size} does not match the model's "
                f"{self.model.config.hidden_size}"
            )
        return table.to(self.model.device, self.model.dtype)

    def item_tokens(self, item_ids: Sequence[int]) -> list[int]:
        """Virtual token ids of catalog items, k per item, in order."""
        if self.item_table is None:
            raise ValueError("the engine has no item table")
        tokens = self.item_table.item_tokens(list(item_ids), self.model.config.vocab_size)
        return tokens.reshape(-1).tolist()

    def _limits(self, table: ItemTable | None) -> RequestLimits:
        cfg = self.model.config
        return RequestLimits(
            vocab_size=cfg.vocab_size, max_positions=cfg.max_position_embeddings,
            item_rows=item_rows(table), user_dim=cfg.user_dim,
            soft_token_id=self.config.soft_token_id,
            item_active=table.active if table is not None else None,
            tokens_per_item=table.tokens_per_item if table is not None else 1,
        )

    def score(
        self, prefix: Part, candidates: Sequence[Part], params: ScoreParams | None = None,
        user_vector: torch.Tensor | Sequence[float] | None = None,
    ) -> torch.Tensor:
        """Score ``candidates`` after one user's ``prefix`` in one request.

        The prefix is computed once; each candidate sees the prefix and itself only, with
        positions continuing from the prefix, so its score does not depend on the others.
        Returns [N, K] log-probs/probs in 'labels' mode, [N] otherwise (CPU, fp32).
        """
        request = ScoreRequest(prefix=prefix, candidates=candidates, user_vector=user_vector)
        return self.score_requests([request], params)[0]

    def score_requests(
        self, requests: Sequence[ScoreRequest], params: ScoreParams | None = None,
        item_table: ItemTable | None = None,
    ) -> list[torch.Tensor]:
        """Score many users' requests, packed into as few forwards as ``max_batch_tokens``
        allows (a request is never split). Virtual item tokens read ``item_table`` (already
        prepared with :meth:`prepare_table`), by default the installed table, read once."""
        return self.run_score(self.prepare_score(requests, params, item_table))

    def prepare_score(
        self, requests: Sequence[ScoreRequest], params: ScoreParams | None = None,
        item_table: ItemTable | None = None,
    ) -> PreparedScore:
        """The host part of :meth:`score_requests`: checks (``InputError`` naming the part)
        and packing; :meth:`run_score` runs it."""
        params = params or ScoreParams()
        params.validate(self.model.config.vocab_size, self.model.score_head is not None)
        if not requests:
            raise InputError("requests: empty request list")
        table = item_table or self.item_table
        batches = [self.pack([r.prefix for r in group], [r.candidates for r in group],
                             [r.user_vector for r in group], item_table=table)
                   for group in token_groups(requests, self.config.max_batch_tokens)]
        return PreparedScore(params, table, batches)

    @torch.inference_mode()
    def run_score(self, prepared: PreparedScore) -> list[torch.Tensor]:
        """The forwards of a :meth:`prepare_score` batch: one score tensor per request (CPU,
        fp32)."""
        model, params = self.model, prepared.params
        results: list[torch.Tensor] = []
        for batch in prepared.batches:
            embeds = self.embed(batch, prepared.table)
            grid = self.scorers.key(batch, params)
            if grid is not None:  # one length of candidates: a fixed grid (a graph on CUDA)
                scores = self.scorers.score(grid, batch, embeds).cpu()
            else:
                hidden = forward_chunked(model, embeds, batch, self.config.chunk_tokens,
                                         last_only=params.mode != "loglik")
                scores = read_scores(model, hidden, batch, params).cpu()
            results.extend(torch.split(scores, batch.branch_counts))
        return results
