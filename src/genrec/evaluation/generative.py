"""Evaluating a generative recommender: full-catalog constrained beam search per user.

Each example's history becomes a prompt (``SidVocab.prompt``, inside ``Engine.recommend``), the
engine returns its top items by beam search over every catalog item, and Recall/NDCG@K are
computed against the one held-out target. Requests are sent in batches.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Literal

import torch
from tqdm.auto import tqdm

from genrec.data.split import Example, leave_one_out
from genrec.engine import BeamParams, Engine, RecommendRequest
from genrec.evaluation.metrics import ranking_metrics, target_ranks

DEFAULT_BEAM_WIDTH = 20


def evaluate_generative(
    engine: Engine, examples: Sequence[Example], user_vectors: torch.Tensor | None = None,
    beam_width: int = DEFAULT_BEAM_WIDTH, ks: Sequence[int] = (5, 10), batch_size: int = 128,
    progress: bool = False,
) -> dict[str, float]:
    """Recall@k / NDCG@k (k in ``ks``) of ``engine`` on ``examples``.

    ``user_vectors`` [num_users, user_dim] (indexed by ``Example.user``) feed the soft token.
    Returns ``{"recall@5", "ndcg@5", "recall@10", "ndcg@10", "n_users", "beam_width"}``.
    """
    if not examples:
        raise ValueError("examples: nothing to evaluate")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = max(ks)
    params = BeamParams(beam_width=beam_width, n=n)
    params.validate()
    top = torch.full((len(examples), n), -1, dtype=torch.int64)
    starts = range(0, len(examples), batch_size)
    for start in tqdm(starts, desc="eval", unit="batch", disable=not progress, leave=False):
        chunk = examples[start : start + batch_size]
        requests = [
            RecommendRequest(
                history=ex.history,
                user_vector=None if user_vectors is None else user_vectors[ex.user],
            )
            for ex in chunk
        ]
        for row, rec in enumerate(engine.recommend(requests, params), start=start):
            top[row, : len(rec.items)] = torch.tensor(rec.items, dtype=torch.int64)
    targets = torch.tensor([ex.target for ex in examples], dtype=torch.int64)
    metrics = ranking_metrics(target_ranks(top, targets), ks)
    metrics["n_users"] = len(examples)
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
    sequences: Sequence[Sequence[int]], split: Literal["val", "test"], max_history: int,
    users: int | None = None, seed: int = 0,
) -> list[Example]:
    """Leave-one-out examples of ``split``: validation = training items -> second-to-last item;
    test = every item before the last (training items + validation item) -> last item."""
    if split not in ("val", "test"):
        raise ValueError(f"split must be 'val' or 'test', got {split!r}")
    loo = leave_one_out(sequences, max_history=max_history)
    return sample_examples(loo.val if split == "val" else loo.test, users, seed)


def evaluate_split(
    engine: Engine, sequences: Sequence[Sequence[int]], split: Literal["val", "test"] = "test",
    user_vectors: torch.Tensor | None = None, beam_width: int = DEFAULT_BEAM_WIDTH,
    users: int | None = None, seed: int = 0, batch_size: int = 128, progress: bool = False,
) -> dict[str, float]:
    """:func:`evaluate_generative` on a leave-one-out split of ``sequences`` (full per-user
    sequences), with the wall time in ``"seconds"``."""
    if engine.vocab is None:
        raise ValueError("engine: not a generative model (no Semantic-ID vocabulary)")
    examples = split_examples(sequences, split, engine.vocab.max_history, users, seed)
    start = time.perf_counter()
    metrics = evaluate_generative(engine, examples, user_vectors, beam_width,
                                  batch_size=batch_size, progress=progress)
    metrics["seconds"] = time.perf_counter() - start
    return metrics
