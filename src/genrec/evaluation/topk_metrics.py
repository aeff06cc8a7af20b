"""Ranking metrics for one held-out target per user: Recall@K and NDCG@K, vectorised.

A user's result is the rank of its target in the recommended list (0 = first), or ``-1`` when
the target is not in the list. With one relevant item, Recall@K is the hit rate and NDCG@K is
``1 / log2(rank + 2)`` when ``rank < K`` (the ideal DCG is 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

MISS = -1


def target_ranks(recommended: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Rank of each target in its row of recommended items, or -1 when absent.

    recommended: int64 [U, n] best first (-1 pads rows with fewer items); targets: [U] -> [U].
    """
    if recommended.dim() != 2 or targets.dim() != 1 or recommended.shape[0] != targets.shape[0]:
        raise ValueError(f"recommended must be [U, n] and targets [U], got "
                         f"{tuple(recommended.shape)} and {tuple(targets.shape)}")
    hit = (recommended == targets[:, None]) & (targets[:, None] >= 0)  # [U, n]
    found = hit.any(dim=1)
    first = hit.to(torch.int64).argmax(dim=1)
    return torch.where(found, first, torch.full_like(first, MISS))


def user_recall(ranks: torch.Tensor, k: int) -> torch.Tensor:
    """Each user's Recall@k (1 when its target ranks within the top ``k``): [U] -> [U] float64."""
    _check_k(k)
    return ((ranks >= 0) & (ranks < k)).double()


def user_ndcg(ranks: torch.Tensor, k: int) -> torch.Tensor:
    """Each user's NDCG@k, ``1 / log2(rank + 2)`` inside the top ``k``: [U] -> [U] float64."""
    _check_k(k)
    inside = (ranks >= 0) & (ranks < k)
    return torch.where(inside, 1.0 / torch.log2(ranks.double().clamp(min=0) + 2.0), 0.0)


def recall_at_k(ranks: torch.Tensor, k: int) -> float:
    """Share of users whose target ranks within the top ``k``."""
    scores = user_recall(ranks, k)
    return float(scores.mean()) if scores.numel() else 0.0


def ndcg_at_k(ranks: torch.Tensor, k: int) -> float:
    """Mean NDCG@k with one relevant item per user: ``1 / log2(rank + 2)`` inside the top k."""
    scores = user_ndcg(ranks, k)
    return float(scores.mean()) if scores.numel() else 0.0


def paired_difference(ranks: torch.Tensor, baseline: torch.Tensor,
                      ks: Sequence[int] = (5, 10)) -> dict[str, dict[str, float]]:
    """Per metric of :func:`ranking_metrics`, the mean of each user's difference between two
    rankings of the same users (``ranks`` minus ``baseline``, both [U]) and its standard error
    (the sample standard deviation of the differences / sqrt(U)): ``{metric: {"difference":
    ..., "se": ...}}``. Two models' results on the same users move together, so this standard
    error is well below either metric's own."""
    if ranks.shape != baseline.shape or ranks.dim() != 1:
        raise ValueError(f"ranks and baseline must be [U] of one size, got "
                         f"{tuple(ranks.shape)} and {tuple(baseline.shape)}")
    n = ranks.numel()
    if n < 2:
        raise ValueError(f"a paired difference needs at least 2 users, got {n}")
    out: dict[str, dict[str, float]] = {}
    for k in ks:
        for name, per_user in (("recall", user_recall), ("ndcg", user_ndcg)):
            d = per_user(ranks, k) - per_user(baseline, k)
            out[f"{name}@{k}"] = {"difference": float(d.mean()), "se": float(d.std() / n**0.5)}
    return out


def ranking_metrics(ranks: torch.Tensor, ks: Sequence[int] = (5, 10)) -> dict[str, float]:
    """``{"recall@k": ..., "ndcg@k": ...}`` for every k in ``ks``, in that order."""
    out: dict[str, float] = {}
    for k in ks:
        out[f"recall@{k}"] = recall_at_k(ranks, k)
        out[f"ndcg@{k}"] = ndcg_at_k(ranks, k)
    return out


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
