"""Sampled-negative ranking metrics of the engine and of a popularity baseline."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from genrec.demo.synthetic import BOS, SyntheticData, item_token, sample_negatives
from genrec.engine import Engine, ScoreParams

LOGLIK = ScoreParams(mode="loglik")


def user_prefix(items: Sequence[int]) -> list[int]:
    """The prompt of a user: ``BOS`` then one token per history item."""
    return [BOS] + [item_token(i) for i in items]


def score_items(engine: Engine, history: Sequence[int], items: Sequence[int]) -> list[float]:
    """log p(item | history) of each item, in one request (the prefix computed once)."""
    scores = engine.score(user_prefix(history), [[item_token(i)] for i in items], LOGLIK)
    return scores.tolist()


def rank_of_positive(pos: float, negs: Sequence[float]) -> float:
    """0-based rank of the positive among the negatives; ties count half (random tie-break)."""
    negs_arr = np.asarray(negs, dtype=np.float64)
    return float((negs_arr > pos).sum() + 0.5 * (negs_arr == pos).sum())


@dataclass
class RankingMetrics:
    """Hit rate and NDCG at ``k`` over ``num_users`` users, 1 positive + ``num_negatives``."""

    hit_rate: float
    ndcg: float
    num_users: int
    k: int
    num_negatives: int


def _metrics(ranks: list[float], k: int, num_negatives: int) -> RankingMetrics:
    hits = [r < k for r in ranks]
    gains = [1.0 / math.log2(r + 2.0) if r < k else 0.0 for r in ranks]
    return RankingMetrics(
        hit_rate=float(np.mean(hits)), ndcg=float(np.mean(gains)), num_users=len(ranks), k=k,
        num_negatives=num_negatives,
    )


def evaluate(
    engine: Engine, data: SyntheticData, users: Sequence[int], item_counts: np.ndarray,
    k: int = 10, num_negatives: int = 99, seed: int = 0,
) -> tuple[RankingMetrics, RankingMetrics]:
    """(model, popularity) metrics: each user's last item is the positive, ranked against
    ``num_negatives`` items sampled uniformly among those the user never saw."""
    rng = np.random.default_rng(seed)
    model_ranks, pop_ranks = [], []
    for u in users:
        seq = data.sequences[u]
        history, target = seq[:-1], seq[-1]
        negatives = sample_negatives(rng, data.config.num_items, seq, num_negatives)
        scores = score_items(engine, history, [target, *negatives])
        model_ranks.append(rank_of_positive(scores[0], scores[1:]))
        pop = item_counts[[target, *negatives]].astype(np.float64)
        pop_ranks.append(rank_of_positive(pop[0], pop[1:]))
    return _metrics(model_ranks, k, num_negatives), _metrics(pop_ranks, k, num_negatives)


def sample_candidates(
    data: SyntheticData, user: int, n: int, seed: int = 0
) -> tuple[list[int], int]:
    """Candidates for ``user``'s next item: the true held-out item, about half the rest from the
    cluster of the last history item, the others from other clusters (all unseen), shuffled.
    Returns (candidates, true item)."""
    rng = np.random.default_rng(seed)
    seq = data.sequences[user]
    target, cluster = seq[-1], int(data.item_cluster[seq[-2]])
    unseen = np.setdiff1d(np.arange(data.config.num_items), seq)
    same = unseen[data.item_cluster[unseen] == cluster]
    other = unseen[data.item_cluster[unseen] != cluster]
    n_same = min(len(same), (n - 1) // 2)
    picked = [target, *rng.choice(same, n_same, replace=False).tolist(),
              *rng.choice(other, n - 1 - n_same, replace=False).tolist()]
    return rng.permutation(picked).tolist(), target
