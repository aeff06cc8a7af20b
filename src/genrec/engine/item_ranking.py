"""Ranking with a model's item head: the beam's proposals pooled with the head's own top items,
every pooled item scored ``log p(Semantic IDs) + item_weight * log p_head(item)``.

The beam's items come with their Semantic-ID log-probabilities from the search; the head's extra
proposals (``BeamParams.head_proposals`` per request, from every live item the request may get:
retired, excluded and not-allowed items never) are scored by multi-item scoring (the summed
log-probability of their IDs after the prompt, the quantity the beam accumulates). An item's score
depends neither on who proposed it nor on the batch. See :mod:`genrec.model.item_head`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from genrec.engine.params import (
    BeamParams,
    Recommendation,
    RecommendRequest,
    ScoreParams,
    ScoreRequest,
)
from genrec.model.item_head import combine, pick, prompt_hidden

if TYPE_CHECKING:
    from genrec.engine.batch import PackedBatch
    from genrec.engine.catalog_state import CatalogState
    from genrec.engine.engine import Engine

LOGLIK = ScoreParams(mode="loglik")


def sid_logprobs(engine: Engine, requests: Sequence[RecommendRequest],
                 items: Sequence[Sequence[int]], catalog: CatalogState) -> list[torch.Tensor]:
    """log p(Semantic IDs of ``items[r]`` | request r's prompt) [len(items[r])]: one
    multi-item scoring request per user (the prompt computed once)."""
    prompts = catalog.prompts([list(q.history) for q in requests],
                              [q.user_vector is not None for q in requests],
                              [q.text for q in requests])
    scored = [r for r, row in enumerate(items) if row]
    score_requests = [
        ScoreRequest(prefix=prompts[r], candidates=catalog.item_tokens(items[r]).tolist(),
                     user_vector=requests[r].user_vector)
        for r in scored
    ]
    out = [torch.zeros(0) for _ in items]
    if score_requests:
        for r, scores in zip(scored, engine.score_requests(score_requests, LOGLIK), strict=True):
            out[r] = scores.float().cpu()
    return out


@torch.no_grad()
def item_scores(engine: Engine, requests: Sequence[RecommendRequest],
                items: Sequence[Sequence[int]], catalog: CatalogState,
                weight: float) -> list[torch.Tensor]:
    """The ranking score of each request's ``items`` [len(items[r])] by one model: its
    Semantic-ID log-probability, plus ``weight`` times its head log-probability for a model
    with an item head (as :func:`rank_with_head` scores them)."""
    sid = sid_logprobs(engine, requests, items, catalog)
    head = engine.model.item_head
    if head is None or not weight or not any(items):
        return sid
    prompts = catalog.prompts([list(q.history) for q in requests],
                              [q.user_vector is not None for q in requests],
                              [q.text for q in requests])
    batch = engine.pack(prompts, [[] for _ in prompts], [q.user_vector for q in requests],
                        require_branches=False)
    device = engine.model.device
    hidden = prompt_hidden(engine.model, engine.embed(batch), batch.prefix_lens,
                           batch.prefix_last.to(device))
    logp = head.log_probs(hidden).cpu()  # [R, num_items of the head]
    out = []
    for r, row in enumerate(items):
        pool = torch.tensor(list(row), dtype=torch.long)[None]
        valid = torch.ones_like(pool, dtype=torch.bool)
        out.append(combine(sid[r][None], pick(logp[r : r + 1], pool), valid, weight)[0]
                   if row else sid[r])
    return out

def _allowed(requests: Sequence[RecommendRequest], catalog: CatalogState, num_items: int,
             device: torch.device) -> torch.Tensor:
    """[R, num_items] bool: the head's items each request may be given."""
    ok = torch.ones(len(requests), num_items, dtype=torch.bool)
    retired = catalog.retired_items.cpu()
    ok[:, retired[retired < num_items]] = False
    for r, q in enumerate(requests):
        if q.allow is not None:
            keep = torch.zeros(num_items, dtype=torch.bool)
            ids = torch.tensor([i for i in q.allow if i < num_items], dtype=torch.long)
            keep[ids] = True
            ok[r] &= keep
        if q.exclude:
            ids = torch.tensor([i for i in q.exclude if i < num_items], dtype=torch.long)
            ok[r, ids] = False
    return ok.to(device)


@torch.no_grad()
def rank_with_head(
    engine: Engine, requests: Sequence[RecommendRequest], batch: PackedBatch,
    catalog: CatalogState, params: BeamParams, items: torch.Tensor, scores: torch.Tensor,
) -> list[Recommendation]:
    """The top ``params.n`` of the beam's proposals ``items`` [R, W] (-1: none; ``scores``
    their Semantic-ID log-probabilities) pooled with the head's proposals, by the combined
    score."""
    model, device = engine.model, engine.model.device
    head = model.item_head
    hidden = prompt_hidden(model, engine.embed(batch), batch.prefix_lens,
                           batch.prefix_last.to(device))
    logp = head.log_probs(hidden)  # [R, num_items of the head]
    extra: list[list[int]] = [[] for _ in requests]
    wanted = params.beam_width if params.head_proposals is None else params.head_proposals
    if wanted:
        free = _allowed(requests, catalog, head.num_items, device)
        in_beam = (items >= 0) & (items < head.num_items)  # the beam's items are pooled
        free[in_beam.nonzero()[:, 0], items[in_beam]] = False
        masked = torch.where(free, logp, torch.full_like(logp, float("-inf")))
        top = masked.topk(min(wanted, head.num_items), dim=1)
        for r, (row, vals) in enumerate(zip(top.indices.tolist(), top.values.tolist(),
                                            strict=True)):
            extra[r] = [i for i, v in zip(row, vals, strict=True) if v > float("-inf")]
    extra_sid = sid_logprobs(engine, requests, extra, catalog)
    out = []
    for r in range(len(requests)):
        mine = items[r][items[r] >= 0]
        pool = torch.cat([mine.cpu(), torch.tensor(extra[r], dtype=torch.long)])
        sid = torch.cat([scores[r][items[r] >= 0].float().cpu(), extra_sid[r]])
        head_scores = pick(logp[r : r + 1], pool[None].to(device)).cpu()
        valid = torch.ones_like(pool, dtype=torch.bool)[None]
        ranked = combine(sid[None], head_scores, valid, params.item_weight)[0]
        # ties: the earlier proposal first (stable sort on the negated score)
        order = torch.sort(-ranked, stable=True).indices[: params.n]
        out.append(Recommendation(items=pool[order].tolist(), scores=ranked[order].tolist()))
    return out
