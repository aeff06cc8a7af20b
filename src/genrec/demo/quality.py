"""Full-catalog quality of the engine's generative retrieval and of a popularity baseline.

Each held-out user's last item is the target; the rest is the history. The engine recommends
by constrained beam search over every catalog item (``Engine.recommend_rows``), the history
excluded; the baseline recommends the most popular items the user has not seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from genrec.demo.synthetic import SyntheticData
from genrec.engine import BeamParams, Engine, RowRecommendation, RowRequest
from genrec.evaluation.full_catalog import popularity_top
from genrec.evaluation.topk_metrics import ndcg_at_k, recall_at_k, target_ranks


def heldout_request(data: SyntheticData, user: int) -> RowRequest:
    """The request of a held-out user: all but the last item as history, history excluded."""
    history = list(data.sequences[user][:-1])
    return RowRequest(history=history, exclude=history)


def recommend_all(
    engine: Engine, requests: Sequence[RowRequest], params: BeamParams,
    batch_size: int = 100,
) -> list[RowRecommendation]:
    """``Engine.recommend_rows`` over ``requests`` in batches of ``batch_size``."""
    out: list[RowRecommendation] = []
    for start in range(0, len(requests), batch_size):
        out.extend(engine.recommend_rows(requests[start : start + batch_size], params))
    return out


@dataclass
class Quality:
    """Recall@k and NDCG@k over ``num_users`` users, one held-out target each."""

    recall: float
    ndcg: float
    num_users: int
    k: int


def quality(top: Sequence[Sequence[int]], targets: Sequence[int], k: int) -> Quality:
    """Recall/NDCG@k of ranked item lists (best first) against one target per user."""
    grid = torch.full((len(top), k), -1, dtype=torch.int64)
    for row, items in enumerate(top):
        items = list(items)[:k]
        grid[row, : len(items)] = torch.tensor(items, dtype=torch.int64)
    ranks = target_ranks(grid, torch.tensor(list(targets), dtype=torch.int64))
    return Quality(recall=recall_at_k(ranks, k), ndcg=ndcg_at_k(ranks, k),
                   num_users=len(top), k=k)


def evaluate(
    engine: Engine, data: SyntheticData, users: Sequence[int], counts: np.ndarray,
    k: int = 10, beam_width: int = 20,
) -> tuple[Quality, Quality, list[RowRecommendation]]:
    """(engine quality, popularity quality, the engine's recommendation of each user)."""
    requests = [heldout_request(data, u) for u in users]
    recs = recommend_all(engine, requests, BeamParams(beam_width=beam_width, n=k))
    targets = [data.sequences[u][-1] for u in users]
    # the most popular items each user has not seen (ties: lower item id first)
    pop = popularity_top(torch.as_tensor(counts), k, len(requests),
                         [list(r.history) for r in requests])
    pop_lists = [[int(i) for i in row if i >= 0] for row in pop.tolist()]
    return quality([r.items for r in recs], targets, k), quality(pop_lists, targets, k), recs
