"""Recommending with several generative models over one Semantic-ID catalog (an ensemble).

Models trained apart (other seeds, sizes or schedules) make different mistakes; the mean of
their log-probabilities ranks items better than any one of them. :class:`Ensemble` does it
with the engine's two primitives:

1. every member runs its own constrained beam search (``beam_width`` beams, all of them
   returned), with the request's filters, so every proposed item is live and allowed;
2. the proposals are pooled per request, and every member scores every pooled item by
   multi-item scoring (``loglik``: the summed log-probability of the item's Semantic IDs after
   the user's prompt, the full-vocabulary score of the beam search; one scoring request per
   user, so the prompt is computed once there, besides once in the member's search);
3. the pool is ranked by the members' mean score; the best ``n`` are returned.

An item one member's beam missed is still scored exactly by that member, so an item's score
does not depend on who proposed it, nor on the other requests of the batch. The members must
share the catalog (the same item -> Semantic ID map, checked at construction by
:meth:`Ensemble.check_catalogs`). Given a ``catalog`` state, every member searches and scores
against it (a server passes its served state, so live updates installed on the first member
reach all); without one, each member reads its own installed catalog.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from genrec.engine.engine import Engine
from genrec.engine.item_ranking import head_log_probs, sid_logprobs, with_head
from genrec.engine.params import BeamParams
from genrec.engine.requests import RowRecommendation, RowRequest
from genrec.engine.retrieval import PreparedSearch, prompts_of
from genrec.live_catalog.state import CatalogState
from genrec.vocab.sid_vocab import SidVocab


@dataclass
class PreparedEnsemble:
    """A batch of recommend requests checked by :meth:`Ensemble.prepare_recommend`: the
    requests, the asked parameters, the catalog state every member reads (None: each
    member's own), and the first member's prepared search (of ``beam_width`` results)."""

    requests: list[RowRequest]
    params: BeamParams
    catalog: CatalogState | None
    first: PreparedSearch


@dataclass
class Ensemble:
    """Generative engines recommending together (see the module docstring); the same
    row-level ``recommend_rows`` / ``prepare_recommend`` / ``run_recommend`` as
    :class:`Engine` (what a server and evaluation call)."""

    engines: Sequence[Engine]

    def __post_init__(self) -> None:
        self.engines = list(self.engines)
        if not self.engines:
            raise ValueError("engines: an ensemble needs at least one engine")
        for k, engine in enumerate(self.engines):
            if engine.catalog is None:
                raise ValueError(f"engines[{k}]: not a generative model (no Semantic IDs)")
            if engine.model.config.user_dim and len(self.engines) > 1:
                raise ValueError(f"engines[{k}]: a model with a soft token cannot be "
                                 "ensembled (each has its own user vectors; a request "
                                 "carries one)")
        self.check_catalogs()

    @property
    def vocab(self) -> SidVocab | None:
        """The members' shared vocabulary (as :attr:`Engine.vocab`)."""
        return self.engines[0].vocab

    def check_catalogs(self) -> None:
        """Raise ValueError unless every member maps every item to the same Semantic ID and
        retires the same items."""
        first = self.engines[0].catalog
        items = torch.arange(first.num_items)
        codes, retired = first.codes_of(items), sorted(first.retired())
        for k, engine in enumerate(self.engines[1:], start=1):
            other = engine.catalog
            if other.num_items != first.num_items or not torch.equal(other.codes_of(items),
                                                                     codes):
                raise ValueError(f"engines[{k}]: its catalog's Semantic IDs differ from "
                                 "engines[0]'s (ensemble members must share one index)")
            if sorted(other.retired()) != retired:
                raise ValueError(f"engines[{k}]: retires other items than engines[0]")

    def recommend_rows(self, requests: Sequence[RowRequest], params: BeamParams | None = None,
                       catalog: CatalogState | None = None) -> list[RowRecommendation]:
        """Top-n items per request: members' beam proposals pooled, ranked by the mean of
        the members' log-probabilities (best first). ``catalog``: one catalog state searched
        by every member (default: each member's installed one, which must agree)."""
        return self.run_recommend(self.prepare_recommend(requests, params, catalog))

    def prepare_recommend(self, requests: Sequence[RowRequest],
                          params: BeamParams | None = None,
                          catalog: CatalogState | None = None) -> PreparedEnsemble:
        """The checks of :meth:`recommend_rows` (``InputError`` naming the field, by the first
        member, as :meth:`Engine.prepare_recommend`); :meth:`run_recommend` runs it."""
        params = params or BeamParams()
        params.validate()
        first = self.engines[0].prepare_recommend(requests, _wide(params), catalog)
        return PreparedEnsemble(list(requests), params, catalog, first)

    def run_recommend(self, prepared: PreparedEnsemble) -> list[RowRecommendation]:
        """The searches and the scoring of a :meth:`prepare_recommend` batch."""
        requests, params, catalog = prepared.requests, prepared.params, prepared.catalog
        wide = _wide(params)  # each member ranks with its own item weight unless one is given
        pools: list[dict[int, None]] = [{} for _ in requests]
        for k, engine in enumerate(self.engines):
            recs = (engine.run_recommend(prepared.first) if k == 0
                    else engine.recommend_rows(requests, wide, catalog))
            for pool, rec in zip(pools, recs, strict=True):
                pool.update(dict.fromkeys(rec.items))
        items = [list(pool) for pool in pools]
        total = [torch.zeros(len(row), dtype=torch.float64) for row in items]
        for engine in self.engines:
            member = self.member_scores(engine, requests, items, catalog, params.item_weight)
            for acc, scores in zip(total, member, strict=True):
                acc += scores.double()
        out = []
        for row, acc in zip(items, total, strict=True):
            mean = acc / len(self.engines)
            # ties: the earlier proposal first (stable sort on the negated score)
            order = torch.sort(-mean, stable=True).indices[: params.n].tolist()
            out.append(RowRecommendation(items=[row[k] for k in order],
                                      scores=[float(mean[k]) for k in order]))
        return out

    @staticmethod
    def member_scores(engine: Engine, requests: Sequence[RowRequest],
                      items: Sequence[Sequence[int]], catalog: CatalogState | None = None,
                      item_weight: float | None = None) -> list[torch.Tensor]:
        """One member's score of each request's ``items`` [len(items[r])]: its log-probability
        by multi-item scoring (one request per user, the prompt computed once), plus
        ``item_weight`` (None: the member's own, :attr:`Engine.item_weight`) times its item
        head's log-probability where it has one (as :mod:`genrec.engine.item_ranking`
        ranks)."""
        catalog = catalog if catalog is not None else engine.catalog
        item_weight = engine.item_weight if item_weight is None else item_weight
        sid = sid_logprobs(engine.score_requests, requests, items, catalog)
        if engine.model.item_head is None or not item_weight or not any(items):
            return sid
        prompts = prompts_of(requests, catalog)
        batch = engine.pack(prompts, [[] for _ in prompts], [q.user_vector for q in requests],
                            require_branches=False)
        with torch.no_grad():
            logp = head_log_probs(engine.model, engine.embed(batch), batch, requests).cpu()
        return with_head(sid, logp, items, item_weight)


def _wide(params: BeamParams) -> BeamParams:
    # what each member searches: beam_width proposals, ranked by the member itself
    return BeamParams(beam_width=params.beam_width, n=params.beam_width,
                      item_weight=params.item_weight, head_proposals=params.head_proposals)
