"""Engine.recommend: prompts from histories, filters, one batched constrained beam search.

In two steps, so that a server can pack the next batch on the host while the device runs
this one: :func:`prepare_search` (checks, prompts, packing, filters) and :func:`run_search`
(the search and the one copy back)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from genrec.catalog.filters import PartFilter
from genrec.engine.batch import PackedBatch
from genrec.engine.inputs import InputError
from genrec.engine.item_ranking import rank_with_head
from genrec.engine.params import BeamParams, Recommendation, RecommendRequest

if TYPE_CHECKING:
    from genrec.engine.engine import Engine
    from genrec.live_catalog.state import CatalogState


@dataclass
class PreparedSearch:
    """A batch of recommend requests checked and packed on the host (:func:`prepare_search`),
    with the catalog state it reads; :func:`run_search` runs it."""

    catalog: CatalogState
    params: BeamParams
    batch: PackedBatch
    filters: list[PartFilter]
    requests: list[RecommendRequest]


def prepare_search(
    engine: Engine, requests: Sequence[RecommendRequest], params: BeamParams,
    catalog: CatalogState | None = None,
) -> PreparedSearch:
    """Validate requests and build their prompts, packing and filters (host work; raises
    ``InputError`` naming the field). ``catalog`` (default: the engine's, read here once)
    gives the vocabulary, the trie and the retired items."""
    catalog = catalog if catalog is not None else engine.catalog
    model = engine.model
    for r, req in enumerate(requests):
        field = f"requests[{r}]"
        history = list(req.history) if not isinstance(req.history, (str, bytes)) else None
        if history is None:
            raise InputError(f"{field}.history: expected a list of item ids")
        catalog.check_items(history, f"{field}.history")
        if req.text is not None:
            catalog.base_vocab.check_text(list(req.text), f"{field}.text")
        if not history and req.user_vector is None and not req.text:
            raise InputError(f"{field}.history: empty history and no user_vector")
        for name in ("exclude", "allow"):
            items = getattr(req, name)
            if items is not None:
                catalog.check_items(list(items), f"{field}.{name}")
    prompts = catalog.prompts([list(q.history) for q in requests],
                              [q.user_vector is not None for q in requests],
                              [q.text for q in requests])
    n_levels = catalog.num_levels
    for r, prompt in enumerate(prompts):
        if len(prompt) + n_levels > model.config.max_position_embeddings:
            raise InputError(f"requests[{r}].history: prompt of {len(prompt)} tokens exceeds "
                             f"the model's {model.config.max_position_embeddings} positions")
    batch = engine.pack(prompts, [[] for _ in prompts], [q.user_vector for q in requests],
                        require_branches=False)
    filters = catalog.search_filters([q.allow for q in requests],
                                     [q.exclude for q in requests])
    return PreparedSearch(catalog, params, batch, filters, list(requests))


def run_search(engine: Engine, prepared: PreparedSearch) -> list[Recommendation]:
    """One beam search for a prepared batch; the top-n items of each request (a model with an
    item head ranks the beam's proposals and its own with it: :mod:`genrec.engine.item_ranking`)."""
    batch, catalog, params = prepared.batch, prepared.catalog, prepared.params
    device = engine.model.device
    result = engine.searches.search(
        catalog.parts(), prepared.filters, catalog.level_offsets, engine.embed(batch),
        batch.layout.prefix_len.tolist(), batch.prefix_last.to(device), params.beam_width,
    )
    items, scores = result.items, result.scores
    if engine.model.item_head is not None and params.item_weight:
        return rank_with_head(engine, prepared.requests, batch, catalog, params, items, scores)
    # the one copy back: non-blocking into pinned memory on a GPU, then one wait
    pinned = device.type == "cuda"
    items = items[:, : params.n].to("cpu", non_blocking=pinned)
    scores = scores[:, : params.n].to("cpu", non_blocking=pinned)
    if pinned:
        torch.cuda.current_stream(device).synchronize()
    out = []
    for row_items, row_scores in zip(items.tolist(), scores.tolist(), strict=True):
        keep = [k for k, item in enumerate(row_items) if item >= 0]  # -1: fewer valid items
        out.append(Recommendation(items=[row_items[k] for k in keep],
                                  scores=[row_scores[k] for k in keep]))
    return out


def exhaustive_top(
    engine: Engine, request: RecommendRequest, n: int, catalog: CatalogState | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: score every allowed live item with multi-item scoring, return the top n
    (items, summed log-probabilities). Slow on big catalogs; for tests and checks. Scores are
    full-vocabulary log-likelihoods: the search's own for ``sid_normalize="full"`` models."""
    from genrec.engine.params import ScoreParams

    catalog = catalog if catalog is not None else engine.catalog
    live = torch.ones(catalog.num_items, dtype=torch.bool)
    live[catalog.retired_items] = False
    if request.allow is not None:
        allowed = torch.zeros_like(live)
        allowed[torch.tensor(list(request.allow), dtype=torch.long)] = True
        live &= allowed
    if request.exclude:
        live[torch.tensor(list(request.exclude), dtype=torch.long)] = False
    items = torch.nonzero(live)[:, 0]
    [prompt] = catalog.prompts([list(request.history)], [request.user_vector is not None],
                               [request.text])
    cands = catalog.item_tokens(items).tolist()
    scores = engine.score(prompt, cands, ScoreParams(mode="loglik"), request.user_vector)
    top = scores.topk(min(n, len(cands)))
    return items[top.indices], top.values
