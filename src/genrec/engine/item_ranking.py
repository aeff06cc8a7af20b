"""Ranking with a model's item head: the beam's proposals pooled with the head's own top items,
every pooled item scored ``log p(Semantic IDs) + item_weight * log p_head(item)``.

The beam's items come with their Semantic-ID log-probabilities from the search; the head's extra
proposals (``BeamParams.head_proposals`` per request, from every live item the request may get:
retired, excluded and not-allowed items never) are scored by multi-item scoring (the summed
log-probability of their IDs after the prompt, the quantity the beam accumulates). An item's score
depends neither on who proposed it nor on the batch. See :mod:`genrec.model.item_head`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from genrec.engine.batch import PackedBatch
from genrec.engine.params import ScoreParams
from genrec.engine.requests import RowRecommendation, RowRequest, ScoreRequest
from genrec.engine.retrieval import PreparedSearch, prompts_of
from genrec.live_catalog.state import CatalogState
from genrec.model.decoder import DecoderLM
from genrec.model.item_head import combine, head_floor, pick, prompt_hidden

LOGLIK = ScoreParams(mode="loglik")

# multi-item scoring of requests (``Engine.score_requests``): one score tensor per request
ScoreFn = Callable[[Sequence[ScoreRequest], ScoreParams], list[torch.Tensor]]


def sid_logprobs(score: ScoreFn, requests: Sequence[RowRequest],
                 items: Sequence[Sequence[int]], catalog: CatalogState) -> list[torch.Tensor]:
    """log p(Semantic IDs of ``items[r]`` | request r's prompt) [len(items[r])] by ``score``:
    one multi-item scoring request per user (the prompt computed once)."""
    prompts = prompts_of(requests, catalog)
    scored = [r for r, row in enumerate(items) if row]
    score_requests = [
        ScoreRequest(prefix=prompts[r], candidates=catalog.item_tokens(items[r]).tolist(),
                     user_vector=requests[r].user_vector)
        for r in scored
    ]
    out = [torch.zeros(0) for _ in items]
    if score_requests:
        for r, scores in zip(scored, score(score_requests, LOGLIK), strict=True):
            out[r] = scores.float().cpu()
    return out


def head_log_probs(model: DecoderLM, embeds: torch.Tensor, batch: PackedBatch,
                   requests: Sequence[RowRequest]) -> torch.Tensor:
    """The item head's log-probabilities [R, num_items of the head] after each prompt of
    ``batch`` (prefixes only; ``embeds`` its input embeddings), on the device; a head with a
    history bias adds it at each of ``requests``' history items."""
    hidden = prompt_hidden(model, embeds, batch.prefix_lens, batch.prefix_last.to(model.device))
    seen = None
    if model.item_head.history_bias is not None:
        width = max((len(q.history) for q in requests), default=0)
        seen = torch.tensor([list(q.history) + [-1] * (width - len(q.history))
                             for q in requests], dtype=torch.long).reshape(len(requests), width)
    return model.item_head.log_probs(hidden, seen)


def with_head(sid: Sequence[torch.Tensor], logp: torch.Tensor, items: Sequence[Sequence[int]],
              weight: float) -> list[torch.Tensor]:
    """The ranking score of each request's ``items``: its Semantic-ID log-probability ``sid[r]``
    plus ``weight`` times its head log-probability (``logp`` [R, num_items], CPU), as
    :func:`rank_with_head` scores them."""
    out = []
    for r, row in enumerate(items):
        pool = torch.tensor(list(row), dtype=torch.long)[None]
        valid = torch.ones_like(pool, dtype=torch.bool)
        out.append(combine(sid[r][None], pick(logp[r : r + 1], pool), valid, weight)[0]
                   if row else sid[r])
    return out

def _mask_disallowed(logp: torch.Tensor, requests: Sequence[RowRequest],
                     catalog: CatalogState, beam: torch.Tensor) -> torch.Tensor:
    """``logp`` [R, num_items] with -inf, in place, wherever request r may not be given the
    item (retired, excluded, outside its ``allow``) or the beam already proposes it
    (``beam`` [R, W], -1: none); returns ``logp``."""
    n, device = logp.shape[1], logp.device
    retired = catalog.retired_items.to(device)
    logp[:, retired[retired < n]] = float("-inf")
    for r, q in enumerate(requests):
        if q.allow is not None:
            ids = torch.tensor([i for i in q.allow if i < n], dtype=torch.long, device=device)
            kept = logp[r, ids].clone()
            logp[r] = float("-inf")
            logp[r, ids] = kept
        if q.exclude:
            ids = torch.tensor([i for i in q.exclude if i < n], dtype=torch.long, device=device)
            logp[r, ids] = float("-inf")
    in_beam = (beam >= 0) & (beam < n)
    logp[in_beam.nonzero()[:, 0], beam[in_beam]] = float("-inf")
    return logp


@dataclass
class HeadPool:
    """One request's pooled proposals, the beam's then the head's: ``items`` [J], their
    Semantic-ID log-probabilities ``sid`` [J] and head log-probabilities ``head`` [J] (an item
    without a head row: the request's lowest, :func:`head_floor`)."""

    items: torch.Tensor
    sid: torch.Tensor
    head: torch.Tensor

    def rank(self, weight: float, n: int) -> RowRecommendation:
        """The top ``n`` by ``sid + weight * head``; ties: the earlier proposal first."""
        ranked = self.sid + weight * self.head
        order = torch.sort(-ranked, stable=True).indices[:n]
        return RowRecommendation(items=self.items[order].tolist(), scores=ranked[order].tolist())


@torch.no_grad()
def pool_with_head(score: ScoreFn, model: DecoderLM, embeds: torch.Tensor,
                   prepared: PreparedSearch, items: torch.Tensor, scores: torch.Tensor
                   ) -> list[HeadPool]:
    """The beam's proposals ``items`` [R, W] (-1: none; ``scores`` their Semantic-ID
    log-probabilities) for the ``prepared`` batch (``embeds``: its input embeddings) pooled
    with the head's proposals (scored by ``score``), per request."""
    requests, catalog, params = prepared.requests, prepared.catalog, prepared.params
    device, head = model.device, model.item_head
    logp = head_log_probs(model, embeds, prepared.batch, requests)
    extra: list[list[int]] = [[] for _ in requests]
    wanted = params.beam_width if params.head_proposals is None else params.head_proposals
    if wanted:
        masked = _mask_disallowed(logp.clone(), requests, catalog, items)
        top = masked.topk(min(wanted, head.num_items), dim=1)
        for r, (row, vals) in enumerate(zip(top.indices.tolist(), top.values.tolist(),
                                            strict=True)):
            extra[r] = [i for i, v in zip(row, vals, strict=True) if v > float("-inf")]
    extra_sid = sid_logprobs(score, requests, extra, catalog)
    out = []
    for r in range(len(requests)):
        mine = items[r][items[r] >= 0]
        pool = torch.cat([mine.cpu(), torch.tensor(extra[r], dtype=torch.long)])
        sid = torch.cat([scores[r][items[r] >= 0].float().cpu(), extra_sid[r]])
        head_scores = pick(logp[r : r + 1], pool[None].to(device)).cpu()
        valid = torch.ones_like(pool, dtype=torch.bool)[None]
        out.append(HeadPool(pool, sid, head_floor(head_scores, valid)[0]))
    return out


def rank_with_head(score: ScoreFn, model: DecoderLM, embeds: torch.Tensor,
                   prepared: PreparedSearch, items: torch.Tensor, scores: torch.Tensor
                   ) -> list[RowRecommendation]:
    """The top ``params.n`` of the beam's proposals pooled with the head's
    (:func:`pool_with_head`) by the combined score at ``params.item_weight``."""
    params = prepared.params
    return [pool.rank(params.item_weight, params.n)
            for pool in pool_with_head(score, model, embeds, prepared, items, scores)]
