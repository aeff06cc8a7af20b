"""Evaluating a generative recommender: full-catalog constrained beam search per user.

Each example's history becomes a prompt (``SidVocab.prompt``, inside ``Engine.recommend_rows``), the
engine returns its top items by beam search over every catalog item, and Recall/NDCG@K are
computed against the one held-out target. Requests are sent in batches.

Popularity is the reference a model must beat: every user gets the items most often seen in the
training parts of all sequences (:func:`item_counts`), scored with the same metrics on the same
examples (:func:`evaluate_popularity`). Both can mask each user's history
(``exclude=full_histories(...)``): items the user already has are then never recommended.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
from tqdm.auto import tqdm

from genrec.data.split import Example, leave_one_out, training_sequences
from genrec.engine import BeamParams, Engine, RowRequest
from genrec.evaluation.topk_metrics import paired_difference, ranking_metrics, target_ranks

if TYPE_CHECKING:
    from genrec.engine.ensemble import Ensemble

DEFAULT_BEAM_WIDTH = 20


def evaluate_generative(
    engine: Engine | Ensemble, examples: Sequence[Example],
    user_vectors: torch.Tensor | None = None,
    beam_width: int = DEFAULT_BEAM_WIDTH, ks: Sequence[int] = (5, 10), batch_size: int = 128,
    progress: bool = False, exclude: Sequence[Sequence[int]] | None = None,
    item_weight: float | None = None, head_proposals: int | None = None,
) -> dict[str, float]:
    """Recall@k / NDCG@k (k in ``ks``) of ``engine`` (or an ensemble) on ``examples``.

    ``user_vectors`` [num_users, user_dim] (indexed by ``Example.user``) feed the soft token.
    ``exclude[i]``: items never to recommend for ``examples[i]`` (e.g. :func:`full_histories`).
    ``item_weight`` (None: the engine's, by default the model's own), ``head_proposals``: see
    :class:`BeamParams` (models with an item head).
    Returns ``{"recall@5", "ndcg@5", "recall@10", "ndcg@10", "n_users", "beam_width"}``.
    """
    ranks = example_ranks(engine, examples, user_vectors, beam_width, max(ks), batch_size,
                          progress, exclude, item_weight, head_proposals)
    return _metrics(ranks, ks, beam_width)


def example_ranks(
    engine: Engine | Ensemble, examples: Sequence[Example],
    user_vectors: torch.Tensor | None = None, beam_width: int = DEFAULT_BEAM_WIDTH,
    n: int = 10, batch_size: int = 128, progress: bool = False,
    exclude: Sequence[Sequence[int]] | None = None, item_weight: float | None = None,
    head_proposals: int | None = None,
) -> torch.Tensor:
    """The rank of each example's target among the engine's top ``n`` (0 = first; -1 when not
    recommended): [len(examples)] int64, what :func:`evaluate_generative`'s metrics are the means
    of (arguments as there)."""
    params = BeamParams(beam_width=beam_width, n=n, item_weight=item_weight,
                        head_proposals=head_proposals)
    top = torch.full((len(examples), params.n), -1, dtype=torch.int64)
    for start, requests in _batches(examples, user_vectors, exclude, batch_size, params,
                                    progress):
        for row, rec in enumerate(engine.recommend_rows(requests, params), start=start):
            top[row, : len(rec.items)] = torch.tensor(rec.items, dtype=torch.int64)
    return _ranks(top, examples)


def evaluate_item_weights(
    engine: Engine, examples: Sequence[Example], item_weights: Sequence[float],
    user_vectors: torch.Tensor | None = None,
    beam_width: int = DEFAULT_BEAM_WIDTH, ks: Sequence[int] = (5, 10), batch_size: int = 128,
    progress: bool = False, exclude: Sequence[Sequence[int]] | None = None,
    head_proposals: int | None = None,
) -> dict[float, dict[str, float]]:
    """:func:`evaluate_generative` of a model with an item head at each of ``item_weights``
    (each > 0) from one search per request (``Engine.head_pools``): the same lists as one
    evaluation per weight, at about the cost of one. Returns ``{weight: metrics}``."""
    if not item_weights or any(not w > 0 for w in item_weights):
        raise ValueError(f"item_weights: expected weights > 0, got {list(item_weights)}")
    params = BeamParams(beam_width=beam_width, n=max(ks), item_weight=max(item_weights),
                        head_proposals=head_proposals)
    tops = {w: torch.full((len(examples), params.n), -1, dtype=torch.int64)
            for w in item_weights}
    for start, requests in _batches(examples, user_vectors, exclude, batch_size, params,
                                    progress):
        for row, pool in enumerate(engine.head_pools(requests, params), start=start):
            for w, top in tops.items():
                items = pool.rank(w, params.n).items
                top[row, : len(items)] = torch.tensor(items, dtype=torch.int64)
    return {w: _metrics(_ranks(top, examples), ks, beam_width) for w, top in tops.items()}


def _batches(examples: Sequence[Example], user_vectors: torch.Tensor | None,
             exclude: Sequence[Sequence[int]] | None, batch_size: int, params: BeamParams,
             progress: bool) -> Iterator[tuple[int, list[RowRequest]]]:
    # (first example's position, its batch of requests), after checking the arguments
    if not examples:
        raise ValueError("examples: nothing to evaluate")
    if exclude is not None and len(exclude) != len(examples):
        raise ValueError(f"exclude: {len(exclude)} lists for {len(examples)} examples")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    params.validate()
    starts = range(0, len(examples), batch_size)
    for start in tqdm(starts, desc="eval", unit="batch", disable=not progress, leave=False):
        chunk = examples[start : start + batch_size]
        yield start, [
            RowRequest(
                history=ex.history,
                user_vector=None if user_vectors is None else user_vectors[ex.user],
                exclude=None if exclude is None else list(exclude[start + i]),
            )
            for i, ex in enumerate(chunk)
        ]


def _ranks(top: torch.Tensor, examples: Sequence[Example]) -> torch.Tensor:
    # top [U, n] best first (-1 padded) -> each example's target rank [U] (-1: not in top)
    return target_ranks(top, torch.tensor([ex.target for ex in examples], dtype=torch.int64))


def _metrics(ranks: torch.Tensor, ks: Sequence[int], beam_width: int) -> dict[str, Any]:
    metrics: dict[str, Any] = ranking_metrics(ranks, ks)
    metrics["n_users"] = ranks.numel()
    metrics["beam_width"] = beam_width
    return metrics


def sample_examples(examples: Sequence[Example], n: int | None, seed: int = 0) -> list[Example]:
    """A fixed random sample of ``n`` examples (all when ``n`` is None or >= their number),
    kept in user order."""
    if n is None or n >= len(examples):
        return list(examples)
    if n < 1:
        raise ValueError(f"number of users must be >= 1, got {n}")
    pick = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed))[:n]
    return [examples[i] for i in sorted(pick.tolist())]


def split_examples(
    sequences: Sequence[Sequence[int]], split: Literal["val", "test"],
    max_history: int | None = None, users: int | None = None, seed: int = 0,
) -> list[Example]:
    """Leave-one-out examples of ``split``: validation = training items -> second-to-last item;
    test = every item before the last (training items + validation item) -> last item. Each
    history is the last ``max_history`` items, or with None every earlier item: what a client
    sends (the prompt keeps a model's last ``max_history`` itself, the history bias reads all)."""
    if split not in ("val", "test"):
        raise ValueError(f"split must be 'val' or 'test', got {split!r}")
    loo = leave_one_out(sequences, max_history=max_history)
    return sample_examples(loo.val if split == "val" else loo.test, users, seed)


def evaluate_split(
    engine: Engine | Ensemble, sequences: Sequence[Sequence[int]],
    split: Literal["val", "test"] = "test",
    user_vectors: torch.Tensor | None = None, beam_width: int = DEFAULT_BEAM_WIDTH,
    users: int | None = None, seed: int = 0, batch_size: int = 128, progress: bool = False,
    mask_history: bool = False, item_weight: float | None = None,
    head_proposals: int | None = None, item_weights: Sequence[float] | None = None,
    against: Engine | Ensemble | None = None, against_vectors: torch.Tensor | None = None,
) -> dict[str, Any]:
    """:func:`evaluate_generative` on a leave-one-out split of ``sequences`` (full per-user
    sequences), with the wall time in ``"seconds"``; ``mask_history``: never recommend an item
    the user already has (:func:`full_histories`, passed to the search as ``exclude``).
    ``item_weights`` (an engine whose model has an item head): the metrics at each weight
    instead, from one search (:func:`evaluate_item_weights`), under ``"by_item_weight"``.
    ``against``: a second model (its own soft-token ``against_vectors``, its own item weight)
    on the same users, under ``"against"``: its metrics, and under ``"paired"`` the mean
    per-user difference of ``engine``'s minus its, with its standard error
    (:func:`paired_difference`)."""
    if engine.vocab is None:
        raise ValueError("engine: not a generative model (no Semantic-ID vocabulary)")
    if against is not None and (item_weights or against.vocab is None):
        raise ValueError("against: a generative model, and not with item_weights")
    examples = split_examples(sequences, split, None, users, seed)
    if against is not None and len(examples) < 2:
        raise ValueError(f"against: a paired difference needs at least 2 users, got "
                         f"{len(examples)}")
    exclude = full_histories(sequences, examples, split) if mask_history else None
    start = time.perf_counter()
    if against is not None:
        ks = (5, 10)
        ranks = example_ranks(engine, examples, user_vectors, beam_width, max(ks), batch_size,
                              progress, exclude, item_weight, head_proposals)
        baseline = example_ranks(against, examples, against_vectors, beam_width, max(ks),
                                 batch_size, progress, exclude, None, head_proposals)
        metrics: dict[str, Any] = {**_metrics(ranks, ks, beam_width),
                                   "against": ranking_metrics(baseline, ks),
                                   "paired": paired_difference(ranks, baseline, ks)}
    elif item_weights:
        by_weight = evaluate_item_weights(engine, examples, item_weights, user_vectors,
                                          beam_width, batch_size=batch_size, progress=progress,
                                          exclude=exclude, head_proposals=head_proposals)
        metrics = {"by_item_weight": by_weight, "n_users": len(examples),
                   "beam_width": beam_width}
    else:
        metrics = evaluate_generative(engine, examples, user_vectors, beam_width,
                                      batch_size=batch_size, progress=progress,
                                      exclude=exclude, item_weight=item_weight,
                                      head_proposals=head_proposals)
    metrics["seconds"] = time.perf_counter() - start
    return metrics


def full_histories(sequences: Sequence[Sequence[int]], examples: Sequence[Example],
                   split: Literal["val", "test"]) -> list[list[int]]:
    """Every item of each example's user before its target (not truncated to ``max_history``):
    the training items, plus the validation item for ``"test"``; the items to mask."""
    if split not in ("val", "test"):
        raise ValueError(f"split must be 'val' or 'test', got {split!r}")
    cut = 1 if split == "test" else 2
    return [list(sequences[ex.user][:-cut]) for ex in examples]


def item_counts(sequences: Sequence[Sequence[int]], num_items: int,
                min_interactions: int = 3) -> torch.Tensor:
    """How often each item occurs in the training parts of ``sequences`` -> [num_items]: all but
    the last two items; users with fewer than ``min_interactions`` keep all, as the split does."""
    items = [i for s in training_sequences(sequences, min_interactions) for i in s]
    return torch.bincount(torch.tensor(items, dtype=torch.int64), minlength=num_items)


def popularity_top(counts: torch.Tensor, n: int, n_users: int,
                   exclude: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
    """Each user's ``n`` most frequent items [n_users, n], most frequent first (ties: lower item
    index first), skipping ``exclude[u]`` when given (rows padded with -1 if too few remain)."""
    order = torch.sort(counts, descending=True, stable=True).indices
    if exclude is None:
        return order[:n].expand(n_users, -1).clone()
    if len(exclude) != n_users:
        raise ValueError(f"exclude: {len(exclude)} lists for {n_users} users")
    top = torch.full((n_users, n), -1, dtype=torch.int64)
    for u, skip in enumerate(exclude):
        head = order[: n + len(skip)]
        keep = head[~torch.isin(head, torch.tensor(list(skip), dtype=torch.int64))][:n]
        top[u, : keep.numel()] = keep
    return top


def evaluate_popularity(
    sequences: Sequence[Sequence[int]], examples: Sequence[Example], num_items: int,
    ks: Sequence[int] = (5, 10), exclude: Sequence[Sequence[int]] | None = None,
) -> dict[str, float]:
    """Recall@k / NDCG@k of recommending the most popular training items (:func:`item_counts`
    of ``sequences``, the full per-user sequences) on ``examples``; ``exclude`` as in
    :func:`evaluate_generative`. Returns the metrics and ``"n_users"``."""
    if not examples:
        raise ValueError("examples: nothing to evaluate")
    top = popularity_top(item_counts(sequences, num_items), max(ks), len(examples), exclude)
    metrics = ranking_metrics(_ranks(top, examples), ks)
    metrics["n_users"] = len(examples)
    return metrics


def popularity_split(
    sequences: Sequence[Sequence[int]], num_items: int, split: Literal["val", "test"] = "test",
    max_history: int = 20, users: int | None = None, seed: int = 0,
    mask_history: bool = False,
) -> dict[str, float]:
    """:func:`evaluate_popularity` on the examples :func:`evaluate_split` evaluates (same split,
    same user sample, history masked or not alike): the baseline printed beside a model."""
    examples = split_examples(sequences, split, max_history, users, seed)
    exclude = full_histories(sequences, examples, split) if mask_history else None
    return evaluate_popularity(sequences, examples, num_items, exclude=exclude)
