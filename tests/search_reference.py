"""Reference for the engine's search: every allowed live item scored by multi-item scoring,
the top n kept (slow on big catalogs; for tests)."""

from __future__ import annotations

import torch

from genrec.engine import Engine, RowRequest, ScoreParams
from genrec.live_catalog.state import CatalogState


def exhaustive_top(
    engine: Engine, request: RowRequest, n: int, catalog: CatalogState | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: score every allowed live item with multi-item scoring, return the top n
    (items, summed log-probabilities). Slow on big catalogs; for tests and checks. Scores are
    full-vocabulary log-likelihoods: the search's own for ``sid_normalize="full"`` models."""
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
