"""Recommendations for many users at once, through the engine directly (no HTTP): each user's
whole history is the prompt (the vocabulary keeps its last ``max_history`` items, as
``/v1/recommend`` does), users go to :meth:`Engine.recommend_rows` in batches, and the answers can
be reranked by a DuoLM ranker (retrieve ``beam_width`` items, keep the ranker's best ``n``, as
``/v1/recommend`` with ``rerank``). :func:`write_recommendations` writes them as JSON lines
in the table's own ids, atomically.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from genrec.duolm.requests import RowRankRequest
from genrec.engine import BeamParams, RowRecommendation, RowRequest
from genrec.utils.atomic import atomic_write

if TYPE_CHECKING:
    from genrec.engine import Engine

#: A ranker's ``rank_rows``: one 1-D tensor of scores per request, higher is better.
Rerank = Callable[[Sequence[RowRankRequest]], Sequence[torch.Tensor]]


@dataclass(frozen=True)
class BatchParams:
    """``n`` items per user out of a beam of ``beam_width`` (``None``: ``n``), ``batch_size``
    users per engine call; a user's own history items are never recommended unless
    ``include_history``."""

    n: int = 50
    beam_width: int | None = None
    batch_size: int = 128
    include_history: bool = False

    def beam(self) -> BeamParams:
        """The search's parameters (``ValueError`` naming the field when they do not fit)."""
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        params = BeamParams(beam_width=self.n if self.beam_width is None else self.beam_width,
                            n=self.n)
        params.validate()
        return params


def recommend_users(
    engine: Engine, histories: Sequence[Sequence[int]], params: BatchParams,
    user_vectors: torch.Tensor | None = None, rerank: Rerank | None = None,
    progress: bool = False,
) -> Iterator[RowRecommendation]:
    """Each history's top ``params.n`` items (catalog rows, best first, with their scores), in
    the order of ``histories``; ``user_vectors[i]`` feeds history ``i``'s soft token.

    ``rerank`` (a ranker's ``rank_rows``): the beam's ``beam_width`` items ordered by its scores
    instead, the best ``n`` kept (the ranker reads the histories, no user vector). The
    progress bar counts users.
    """
    beam = params.beam()
    if rerank is not None:  # retrieve the whole beam, the ranker keeps n of it
        beam = BeamParams(beam_width=beam.beam_width, n=beam.beam_width)
    if user_vectors is not None and len(user_vectors) != len(histories):
        raise ValueError(f"user_vectors: {len(user_vectors)} rows for {len(histories)} users")
    with tqdm(total=len(histories), desc="recommend", unit="user", disable=not progress,
              leave=False) as bar:
        for start in range(0, len(histories), params.batch_size):
            chunk = histories[start:start + params.batch_size]
            vectors = None if user_vectors is None else user_vectors[start:start + len(chunk)]
            requests = [RowRequest(
                history=list(h), user_vector=None if vectors is None else vectors[i],
                exclude=None if params.include_history else sorted(set(h)))
                for i, h in enumerate(chunk)]
            found = engine.recommend_rows(requests, beam)
            if rerank is not None:
                found = _reranked(rerank, requests, found, params.n)
            yield from found
            bar.update(len(chunk))


def _reranked(rerank: Rerank, requests: Sequence[RowRequest],
              found: Sequence[RowRecommendation], n: int) -> list[RowRecommendation]:
    """``found`` ordered by the ranker's scores (the best ``n`` of each kept)."""
    out: list[RowRecommendation] = [RowRecommendation([], []) for _ in found]
    asked = [k for k, rec in enumerate(found) if rec.items]
    if not asked:
        return out
    scores = rerank([RowRankRequest(history=requests[k].history, candidates=found[k].items)
                     for k in asked])
    for k, values in zip(asked, scores, strict=True):
        values = torch.as_tensor(values, dtype=torch.float32).reshape(-1)
        top = torch.argsort(values, descending=True, stable=True)[:n].tolist()
        out[k] = RowRecommendation([found[k].items[i] for i in top],
                                [float(values[i]) for i in top])
    return out


def write_recommendations(path: str | Path, user_ids: Sequence[str], item_ids: Sequence[str],
                          found: Iterable[RowRecommendation]) -> int:
    """``found`` (one per user of ``user_ids``, items as catalog rows) as JSON lines
    ``{"user_id", "items", "scores"}`` with the table's ``item_ids``, written to ``path``
    atomically (a temporary file renamed over it once complete: a reader never sees a partial
    file, an interrupted run leaves the old one). Returns the number of lines."""
    written = 0

    def write(tmp: str) -> None:
        nonlocal written
        with open(tmp, "w") as f:
            for user, rec in zip(user_ids, found, strict=True):
                line = {"user_id": user, "items": [item_ids[i] for i in rec.items],
                        "scores": rec.scores}
                f.write(json.dumps(line) + "\n")
                written += 1

    atomic_write(path, write)
    return written
