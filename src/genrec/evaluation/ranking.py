"""Candidate-ranking evaluation: the held-out item among sampled negatives.

Each example's candidates are its target first, then ``num_negatives`` items the user never
interacted with, drawn with a fixed seed (the same lists for every model compared); with
``num_negatives=None`` every such item (full-catalog ranking). A target's
rank is the number of candidates scored strictly higher plus the number tied with it (ties
count against the model, so a constant scorer ranks last). Metrics: NDCG@K, Recall@K, MRR.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from tqdm.auto import tqdm

from genrec.data.split import Example
from genrec.evaluation.topk_metrics import ranking_metrics


def sample_candidates(
    examples: Sequence[Example], sequences: Sequence[Sequence[int]], num_items: int,
    num_negatives: int | None = 99, seed: int = 0,
) -> list[list[int]]:
    """``[target, neg_1, ..., neg_M]`` per example; negatives avoid the user's items (all of
    the other items when ``num_negatives`` is None)."""
    gen = torch.Generator().manual_seed(seed)
    out: list[list[int]] = []
    for ex in examples:
        seen = set(sequences[ex.user]) | {ex.target}
        if num_negatives is None:
            out.append([ex.target] + [i for i in range(num_items) if i not in seen])
            continue
        room = num_items - sum(1 for i in seen if 0 <= i < num_items)
        if room < num_negatives:
            raise ValueError(f"user {ex.user}: only {room} items left to sample "
                             f"{num_negatives} negatives from")
        negs: list[int] = []
        chosen: set[int] = set()
        while len(negs) < num_negatives:
            for i in torch.randint(num_items, (2 * num_negatives,), generator=gen).tolist():
                if i not in seen and i not in chosen:
                    chosen.add(i)
                    negs.append(i)
                    if len(negs) == num_negatives:
                        break
        out.append([ex.target] + negs)
    return out


def target_rank(scores: torch.Tensor) -> int:
    """Rank (0 = best) of candidate 0 among ``scores`` [C]; ties count against it, and a NaN
    target score ranks last."""
    others = scores[1:]
    if bool(torch.isnan(scores[0])):
        return int(others.numel())
    return int((others >= scores[0]).sum())


def mrr(ranks: torch.Tensor) -> float:
    """Mean reciprocal rank (ranks 0-based)."""
    return float((1.0 / (ranks.double() + 1.0)).mean()) if ranks.numel() else 0.0


def evaluate_ranking(
    score: Callable[[Sequence[Example], Sequence[Sequence[int]]], list[torch.Tensor]],
    examples: Sequence[Example], candidates: Sequence[Sequence[int]], batch_size: int = 32,
    progress: bool = False, ks: Sequence[int] = (5, 10),
) -> dict[str, float]:
    """Metrics of a scorer: ``score(examples, candidate_lists)`` -> one score tensor per
    example (candidate order kept). Returns recall@k, ndcg@k, mrr and the user count."""
    if len(candidates) != len(examples):
        raise ValueError(f"candidates: {len(candidates)} lists for {len(examples)} examples")
    ranks = []
    starts = range(0, len(examples), batch_size)
    for s in tqdm(starts, desc="rank", unit="batch", disable=not progress):
        cands = candidates[s : s + batch_size]
        scores = score(examples[s : s + batch_size], cands)
        if len(scores) != len(cands) or any(
            x.numel() != len(c) for x, c in zip(scores, cands, strict=True)
        ):
            raise ValueError(f"score: expected one score per candidate of {len(cands)} "
                             f"examples, got {[tuple(x.shape) for x in scores]}")
        ranks += [target_rank(x.float().reshape(-1)) for x in scores]
    r = torch.tensor(ranks, dtype=torch.long)
    return {**ranking_metrics(r, ks), "mrr": mrr(r), "users": float(len(ranks))}
